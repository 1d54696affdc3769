"""What the security tests share: planted secrets and where to look for them, a sampler of
process command lines, the Pod Security ``restricted`` checks of a probe pod spec, and a
PostgreSQL role that really needs its password.

Planted values are distinctive per run (a random suffix), so a hit can only come from this
test, never from another test on the same machine that plants the fixtures' constants.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from taskhandler_devenv.postgres import PostgresServer
from taskhandler_operator.kube import names

#: The mount point of a service-account token; a probe pod must have nothing there.
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def planted(kind: str) -> str:
    """A distinctive secret value: ``thop-planted-<kind>-<random>``."""
    return f"thop-planted-{kind}-{secrets.token_hex(6)}"


def leaks(text: str, values: Iterable[str]) -> list[str]:
    """The planted ``values`` found in ``text`` (also base64 of them, as a Secret holds them)."""
    import base64

    found = []
    for value in values:
        encoded = base64.b64encode(value.encode()).decode().rstrip("=")
        if value in text or encoded[:-2] in text:
            found.append(value)
    return found


# --- process command lines ------------------------------------------------------------------


def _ancestry(pid: int) -> list[int]:
    """``pid`` and its ancestors (as far as /proc still shows them)."""
    chain = [pid]
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        chain.append(pid)
    return chain


@dataclass
class CmdlineSampler:
    """Reads every process's ``/proc/<pid>/cmdline`` every ``interval`` seconds in a thread.

    Records the command lines of this test's own processes (descendants of the test process:
    the operator, the process node's pod containers, the source servers) that hold a planted
    value, and those that look like probe pods' containers (``taskhandler-operator fetch`` or
    ``probe``), so a test can show it saw the probes it claims to have checked.
    """

    values: Sequence[str]
    interval: float = 0.05
    hits: list[str] = field(default_factory=list)
    probes: set[str] = field(default_factory=set)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _scan(self) -> None:
        me = os.getpid()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                raw = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if not raw:
                continue
            argv = raw.rstrip(b"\0").split(b"\0")
            line = " ".join(a.decode(errors="replace") for a in argv)
            # A container command runs as "<python> <venv>/bin/taskhandler-operator fetch ...".
            tool = next(
                (i for i, a in enumerate(argv[:3]) if a.endswith(b"taskhandler-operator")), None
            )
            verb = argv[tool + 1] if tool is not None and len(argv) > tool + 1 else b""
            is_probe = (verb == b"fetch" and b"--manifest" in argv) or (
                verb == b"probe" and b"--bundle-root" in argv
            )
            found = [v for v in self.values if v in line]
            if not (is_probe or found):
                continue
            if me not in _ancestry(int(entry.name)):
                continue
            if is_probe:
                self.probes.add(verb.decode())
            if found:
                self.hits.append(line[:500])

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._scan()
            self.samples += 1

    def __enter__(self) -> CmdlineSampler:
        self._thread = threading.Thread(target=self._run, name="cmdline-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


# --- probe pod specs ------------------------------------------------------------------------


def restriction_problems(pod_spec: Mapping[str, Any], probe_account: str) -> list[str]:
    """Everything in ``pod_spec`` that breaks the probe pod's contract (DESIGN §3.5): no
    token, the no-permission account, non-root, read-only root, no capabilities, seccomp
    ``RuntimeDefault``, limits, no host namespaces, nothing from Secrets. Empty when it holds."""
    problems: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    need(pod_spec.get("automountServiceAccountToken") is False, "automountServiceAccountToken")
    need(pod_spec.get("serviceAccountName") == probe_account, "serviceAccountName")
    # Service links would hand every pod the addresses of the namespace's Services.
    need(pod_spec.get("enableServiceLinks") is False, "enableServiceLinks")
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        need(not pod_spec.get(host), host)
    pod_security = pod_spec.get("securityContext") or {}
    need(pod_security.get("runAsNonRoot") is True, "pod runAsNonRoot")
    need(
        (pod_security.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
        "pod seccompProfile RuntimeDefault",
    )
    for volume in pod_spec.get("volumes") or ():
        kinds = set(volume) - {"name"}
        need(kinds == {"emptyDir"}, f"volume {volume.get('name')} is {sorted(kinds)}")
    containers = [*(pod_spec.get("initContainers") or ()), *(pod_spec.get("containers") or ())]
    need(bool(containers), "containers")
    for c in containers:
        name = c.get("name")
        ctx = c.get("securityContext") or {}
        need(ctx.get("readOnlyRootFilesystem") is True, f"{name} readOnlyRootFilesystem")
        need(ctx.get("allowPrivilegeEscalation") is False, f"{name} allowPrivilegeEscalation")
        need(not ctx.get("privileged"), f"{name} privileged")
        caps = ctx.get("capabilities") or {}
        need(caps.get("drop") == ["ALL"] and not caps.get("add"), f"{name} capabilities")
        limits = (c.get("resources") or {}).get("limits") or {}
        need({"cpu", "memory"} <= set(limits), f"{name} cpu and memory limits")
        need(not c.get("envFrom"), f"{name} envFrom")
        for env in c.get("env") or ():
            need("valueFrom" not in env, f"{name} env {env.get('name')} from a reference")
        for mount in c.get("volumeMounts") or ():
            need(not mount["mountPath"].startswith(TOKEN_MOUNT), f"{name} mounts a token")
        need(not c.get("ports"), f"{name} ports")
    return problems


#: A Job whose pod breaks ``restricted`` in the usual ways (root, privilege escalation allowed,
#: capabilities kept, no seccomp): the control that the namespace's admission does refuse.
def unrestricted_job(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.local/none:0",
                            "command": ["true"],
                            "securityContext": {"runAsUser": 0},
                        }
                    ],
                }
            },
        },
    }


def as_pod(namespace: str, name: str, template: Mapping[str, Any]) -> dict[str, Any]:
    """A bare Pod with ``template``'s spec (to ask admission about exactly that spec)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": template["spec"],
    }


def psa_dry_run(cluster: KubeCluster, pod: Mapping[str, Any]) -> Any:
    """``kubectl create --dry-run=server`` of ``pod``: admission runs, nothing is stored."""
    return cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )


def probe_account_bindings(cluster: KubeCluster, namespace: str) -> list[str]:
    """Every RoleBinding or ClusterRoleBinding naming the probe account (there must be none).
    (What every service account gets through its groups is the cluster's default discovery
    access; the chart's RBAC test compares the probe account with an unbound one.)"""
    found = []
    for kind, scope in (("rolebindings", ("-A",)), ("clusterrolebindings", ())):
        items = json.loads(cluster.kubectl("get", kind, *scope, "-o", "json").stdout)["items"]
        for item in items:
            for subject in item.get("subjects") or ():
                if (subject.get("kind"), subject.get("name"), subject.get("namespace")) == (
                    "ServiceAccount",
                    names.PROBE_APP,
                    namespace,
                ):
                    found.append(f"{kind}/{item['metadata']['name']}")
    return found


# --- a database password that matters -------------------------------------------------------


def password_role(pg_server: PostgresServer, db_url: str, password: str) -> str:
    """``db_url`` as a new login role that must give ``password`` (scram-sha-256 over TCP;
    the test server trusts everyone else), so a wrong password is really refused."""
    role = f"thop_sec_{secrets.token_hex(4)}"
    with pg_server.connect() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
        hba = pg_server.data_dir / "pg_hba.conf"
        rules = "".join(
            f"host all {role} {net} scram-sha-256\n" for net in ("127.0.0.1/32", "::1/128")
        )
        hba.write_text(rules + hba.read_text())  # first match wins
        conn.execute("SELECT pg_reload_conf()")
    url = make_url(db_url).set(username=role, password=password)
    rendered: str = url.render_as_string(hide_password=False)
    # The reload is asynchronous: wait until the rule is in force.
    wrong = make_url(db_url).set(username=role, password="not-it")
    for _ in range(100):
        try:
            psycopg.connect(
                wrong.set(drivername="postgresql").render_as_string(hide_password=False),
                connect_timeout=5,
            ).close()
        except psycopg.OperationalError:
            return rendered
        threading.Event().wait(0.1)
    raise AssertionError("pg_hba.conf's password rule never took effect")
