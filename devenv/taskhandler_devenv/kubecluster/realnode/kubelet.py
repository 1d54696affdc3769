"""The kubelet's configuration, the CNI network it gives pods, and kube-scheduler's argv.

Kubelet settings each of which the node failed without (shared/reference/real-node.md):
``failCgroupV1: false`` (the machine is cgroup v1 hybrid), ``oomScoreAdj: 0`` (no
CAP_SYS_RESOURCE to lower it to -999), ``failSwapOn: false``, a serving certificate for the node
IP (the apiserver reaches logs and exec there). Eviction and image GC are off: a shared test
machine's disk must not evict the tests' pods.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..certs import CertPair
from .check import NodeBins

POD_SUBNET = "10.244.0.0/24"
BRIDGE = "thop0"
NETWORK = "thop-pods"


def cni_conflist(ipam_dir: Path) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    # Without it pods have no default route (nothing beyond the bridge).
                    "isDefaultGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(ipam_dir),
                    },
                }
            ],
        },
        indent=2,
    )


def kubelet_config(
    root: Path,
    node_ip: str,
    port: int,
    serving: CertPair,
    client_ca: Path,
    runtime_socket: Path,
) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "podLogsDir": str(root / "pod-logs"),
        "volumePluginDir": str(root / "volume-plugins"),
        "resolvConf": "/etc/resolv.conf",
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "registerNode": True,
        "maxPods": 60,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kubelet_argv(
    bins: NodeBins, config: Path, kubeconfig: Path, root: Path, name: str, node_ip: str
) -> list[str]:
    return [
        str(bins["kubelet"]),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root / 'kubelet'}",
        f"--cert-dir={root / 'kubelet-pki'}",
        f"--hostname-override={name}",
        f"--node-ip={node_ip}",
        "--v=1",
    ]


def scheduler_argv(bins: NodeBins, kubeconfig: Path) -> list[str]:
    return [
        str(bins["kube-scheduler"]),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--secure-port=0",
        "--v=1",
    ]
