"""The chart's values and the host wiring for a release on the real node
(docs/testing-kubernetes.md, "Real node"; tests/e2e/test_chart_real_node.py).

Pods on the real node sit on the CNI bridge, with neither kube-proxy nor cluster DNS, while the
test's servers (PostgreSQL, the git/HTTP source) listen on loopback. Each is given to the pods at
a fixed virtual address in 198.18.0.0/15 (reserved for benchmarks: no real, pod or Service
address) by an nftables DNAT in one table of its own, removed at the end: to 127.0.0.1 for a host
server (the node's bridge has ``route_localnet``), to the operator pod for its artifact server
(masqueraded, so the answer of a pod on the same bridge comes back through the host and is
translated back).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from taskhandler_devenv.kubecluster.realnode.check import nft_binary
from taskhandler_devenv.kubecluster.realnode.kubelet import POD_SUBNET
from taskhandler_devenv.postgres import PostgresServer

NFT_TABLE: Final = "thop_e2e_expose"
POSTGRES_IP: Final = "198.18.0.1"
SOURCES_IP: Final = "198.18.0.2"
ARTIFACT_IP: Final = "198.18.0.3"
# The images' revision label: fixed, so a commit that changes no image input does not rebuild
# them, and one cached build serves the chart e2e and ``make demo`` alike.
IMAGE_REVISION: Final = "e2e-real-node"
LOCAL_IMAGES: Final = {
    "operator": "localhost/taskhandler-operator",
    "java": "localhost/taskhandler-probe-java",
    "typescript": "localhost/taskhandler-probe-node",
}


class ExposureError(Exception):
    """nft refused the rules; the message is nft's."""


def real_node_values(
    version: str,
    *,
    database_secret: str,
    artifact_url: str,
    watch_namespaces: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``--set`` arguments for ``helm install`` with the locally built images (there is no
    registry: ``imagePullPolicy: Never`` for the operator and its probe Jobs)."""
    values = [
        f"image.repository={LOCAL_IMAGES['operator']}",
        f"image.tag={version}",
        "image.pullPolicy=Never",
        "probe.imagePullPolicy=Never",
        *(
            f"probe.runtimeImages.{lang}.{key}={value}"
            for lang in ("java", "typescript")
            for key, value in (("repository", LOCAL_IMAGES[lang]), ("tag", version))
        ),
        f"database.existingSecret={database_secret}",
        f"artifactServer.url={artifact_url}",
        "logging.format=text",
    ]
    if watch_namespaces:
        values += ["watch.mode=namespaced", f"watch.namespaces={{{','.join(watch_namespaces)}}}"]
    values += extra
    return [arg for value in values for arg in ("--set", value)]


@dataclass(frozen=True)
class Forward:
    """Packets from pods to ``ip:port`` go to ``to_ip:to_port``."""

    ip: str
    port: int
    to_ip: str
    to_port: int


def render_table(forwards: list[Forward], pod_subnet: str = POD_SUBNET) -> str:
    """The nft script that (re)creates the table with these forwards, atomically."""
    dnat = "\n".join(
        f"    ip daddr {f.ip} tcp dport {f.port} dnat to {f.to_ip}:{f.to_port}" for f in forwards
    )
    return f"""table ip {NFT_TABLE} {{}}
delete table ip {NFT_TABLE}
table ip {NFT_TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority -110; policy accept;
{dnat}
  }}
  chain postrouting {{
    type nat hook postrouting priority 110; policy accept;
    ip saddr {pod_subnet} ip daddr {pod_subnet} ct status dnat masquerade
  }}
}}
"""


@dataclass
class Exposure:
    """The DNAT table; ``close`` removes it (and it is idempotent)."""

    forwards: list[Forward] = field(default_factory=list)

    def add(self, forward: Forward) -> None:
        self.forwards = [f for f in self.forwards if (f.ip, f.port) != (forward.ip, forward.port)]
        self.forwards.append(forward)
        self._nft(render_table(self.forwards))

    def close(self) -> None:
        self.forwards = []
        self._nft(f"table ip {NFT_TABLE} {{}}\ndelete table ip {NFT_TABLE}\n")

    @staticmethod
    def _nft(script: str) -> None:
        done = subprocess.run(
            [nft_binary() or "nft", "-f", "-"], input=script, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise ExposureError(f"nft: {done.stderr.strip()}")


HBA_MARK: Final = "# the real node's pods (realnode_install)"


@contextmanager
def pods_may_connect(server: PostgresServer, pod_subnet: str = POD_SUBNET) -> Iterator[None]:
    """Let pods connect (the DNAT keeps their source address); ``pg_hba.conf`` as it was after."""
    hba = server.data_dir / "pg_hba.conf"
    before = hba.read_text()
    hba.write_text(f"{before}\n{HBA_MARK}\nhost all all {pod_subnet} trust\n")
    _reload(server)
    try:
        yield
    finally:
        hba.write_text(before)
        _reload(server)


def _reload(server: PostgresServer) -> None:
    with server.connect() as conn:
        conn.execute("SELECT pg_reload_conf()")
