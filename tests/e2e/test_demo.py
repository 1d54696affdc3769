"""``make demo`` end to end: ``hack/demo.py --once`` run from the checkout as a subprocess.

One run (module fixture) installs the chart with the real helm on the local control plane and
binds the three example bundles; the tests assert its stable lines (table rows, bindings, the
"try it" commands, the shutdown), never timings, ports or temporary paths, and that every line
the README and docs/demo.md quote as its output appears in the real output. A second run with
PostgreSQL's binaries pointed elsewhere fails in step 3 and still removes everything.

Which node: the run is on the real node wherever ``real_node_unavailable()`` allows it, and the
test asserts the demo said so. When this session holds the machine's lock itself
(``tests/fixtures/realnode.py`` keeps it from its first real-node test to the session's end, as
in a whole run), it lends its hold to the demo (``check.lend_host_lock``: the child inherits the
lock's open file) after its own node stopped, and the demo runs with its default ``--node
auto``, which picks the real node: it neither deadlocks nor waits. Otherwise another run may
hold or take the lock, so the demo runs with ``--node real`` and waits for it
(``THOP_REAL_NODE_LOCK_WAIT``, printing that it waits) rather than falling back. Elsewhere the
test expects the fallback and its reason. The failing run is forced to fall back (``NODE_BINS``
pointed at an empty folder) and asserts the demo said so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from taskhandler_devenv.kubecluster.realnode import check as realnode_check
from taskhandler_devenv.kubecluster.realnode import real_node_unavailable
from tests.fixtures import realnode as realnode_fixtures

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO = REPO_ROOT / "hack" / "demo.py"
TOOLCHAINS = ("go", "javac", "java", "node")
# A first run may build the node venv, the Airflow side venv and the runtimes.
DEMO_TIMEOUT = 1200.0
#: Put right before a fenced block in a Markdown file: each line of the block must appear in
#: the real output; ``…`` stands for any text (ports, revisions, ages, paths).
QUOTE_MARKER = "<!-- demo output: checked against a real run by tests/e2e/test_demo.py -->"

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(2 * DEMO_TIMEOUT + 120),
]

NAMES = ("orders-go", "orders-java", "orders-typescript")
LANGUAGES = ("go", "java", "typescript")
# A healthy bundle's conditions (kstatus' Reconciling and Stalled are absent when healthy).
ALL_TRUE = ("Ready", "SourceReady", "ArtifactsProbed", "BindingsPublished", "DagBundleInSync")

BINDINGS = (
    ("extract", "orders-go/extract"),
    ("transform", "orders-java/orders-transform.jar"),
    ("publish", "orders-typescript/publish.min.mjs"),
)


@dataclass(frozen=True)
class DemoRun:
    returncode: int
    out: str
    tmp: Path
    node: str = "process"

    def section(self, number: str) -> str:
        """The output of step ``number``, from its ``=== N.`` heading to the next one."""
        match = re.search(rf"^=== {number}\. .*?(?=^=== |\Z)", self.out, re.M | re.S)
        assert match is not None, f"no step {number} in:\n{self.out[-3000:]}"
        return match.group(0)


def run_demo(
    tmp_path: Path, *args: str, node: str = "process", fds: tuple[int, ...] = (), **env: str
) -> DemoRun:
    missing = [tool for tool in TOOLCHAINS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH; the demo builds runtimes with them")
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--once", *args],
        cwd=REPO_ROOT,
        # TMPDIR: the demo's work folder lands in tmp_path, so a leftover would be seen.
        env={**os.environ, "TMPDIR": str(tmp_path), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=DEMO_TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
        pass_fds=fds,
    )
    return DemoRun(proc.returncode, proc.stdout, tmp_path, node)


def machine_runs_real_node() -> bool:
    """The real node can start here, maybe once another run's node (holding the lock) ended."""
    reason = real_node_unavailable()
    return reason is None or reason.startswith(realnode_check.LOCK_REASON)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    tmp = tmp_path_factory.mktemp("demo")
    reason = real_node_unavailable()
    if not machine_runs_real_node():
        run = run_demo(tmp)
        assert f"node: process (fallback: {reason})" in run.out.splitlines(), run.out[:3000]
        return run
    # This session's own real node (if any) was stopped after its last test; a lent lock must
    # not cover two nodes.
    assert all(world.cluster is None for world in realnode_fixtures._worlds)
    env, fds = realnode_check.lend_host_lock()
    # Lent: the default (auto) picks the real node, as nothing can take the lock meanwhile.
    # Otherwise another run may hold or take it: --node real waits for it, never falls back.
    args = () if fds else ("--node", "real")
    return run_demo(tmp, *args, node="real", fds=fds, **env)


def quoted_lines(markdown: Path) -> list[str]:
    """The lines of the fenced block right after :data:`QUOTE_MARKER` in ``markdown``."""
    text = markdown.read_text(encoding="utf-8")
    assert QUOTE_MARKER in text, f"{markdown.name} quotes no demo output"
    block = re.search(r"```\w*\n(.*?)\n```", text.split(QUOTE_MARKER, 1)[1], re.S)
    assert block is not None, f"no fenced block after the marker in {markdown.name}"
    return [line for line in block.group(1).splitlines() if line.strip() not in ("", "…")]


def line_pattern(quoted: str) -> re.Pattern[str]:
    """``…`` matches any text; a run of spaces matches any run (column widths vary)."""
    pieces = [re.sub(r"(\\ )+", r"\\s+", re.escape(p.strip())) for p in quoted.split("…")]
    return re.compile(r"^\s*" + ".*".join(pieces) + r"\s*$", re.M)


def conditions_described(text: str) -> dict[str, str]:
    """Type -> Status from the ``Conditions:`` block of ``kubectl describe`` output."""
    block = re.search(r"^(\s+)Conditions:\n(.*?)(?=^\1\S|\Z)", text, re.M | re.S)
    assert block is not None, text
    types = re.findall(r"^\s+Type:\s+(\S+)$", block.group(2), re.M)
    statuses = re.findall(r"^\s+Status:\s+(\S+)$", block.group(2), re.M)
    assert len(types) == len(statuses), block.group(2)
    return dict(zip(types, statuses, strict=True))


def work_folder(out: str) -> Path:
    match = re.search(r"^work folder \$DEMO = (\S+)$", out, re.M)
    assert match is not None, out[:500]
    return Path(match.group(1))


def test_the_demo_installs_the_chart_and_binds_three_bundles(demo: DemoRun) -> None:
    assert demo.returncode == 0, demo.out[-6000:]
    # The one-time cost is stated before anything is built.
    assert 0 <= demo.out.find("One-time cost on a fresh machine") < demo.out.index("=== 1. ")

    # 1-2: which node ran, said before the build and in step 2's title.
    build = demo.section("1")
    if demo.node == "real":
        assert "node: real (kubelet, containerd and runc; the images built from images/)" in build
        assert "localhost/taskhandler-operator:" in build  # the images, built or cached
        assert re.search(
            r"^3 images imported into the node's containerd in \d+\.\d s", demo.section("2"), re.M
        ), demo.section("2")
        assert re.search(
            r"^the git server pod at [0-9.]+ \(no cluster DNS", demo.section("4"), re.M
        )
    else:
        assert re.search(r"^node: process \((fallback: .+|--node process)\)$", build, re.M), build
    assert re.search(
        rf"^=== 2\. Start the local control plane with the {demo.node} node =+$", demo.out, re.M
    )
    assert re.search(
        rf"^etcd, kube-apiserver, kube-controller-manager and the {demo.node} node ready in ",
        demo.section("2"),
        re.M,
    )

    # 4: the bundles are served by the git server pod of the very manifests the kind path
    # applies (hack/kind/examples/), and pushed to it.
    serve = demo.section("4")
    assert "(hack/kind/examples/namespace.yaml and git-server.yaml, as make kind-examples)" in serve
    assert re.search(
        r"^git repository \S+ \(basic auth\), pushed branch main at [0-9a-f]{12}$", serve, re.M
    )
    assert re.search(r"^\s+pod/bundle-git-server-\S+\s+1/1\s+Running", demo.out, re.M)

    # 5: helm installed the chart; its hook Job created the binding tables.
    assert "the pre-install hook Job ran `taskhandler-operator db upgrade`" in demo.section("5")
    assert re.search(r"^\s+pod/thop-taskhandler-operator-\S+\s+1/1\s+Running", demo.out, re.M)

    # 4: Airflow's dag_bundle rows for the three bundles, at the commit served.
    assert re.search(
        r"^Airflow's dag_bundle rows at version [0-9a-f]{12}: orders-go, orders-java, "
        r"orders-typescript$",
        demo.section("4"),
        re.M,
    ), demo.section("4")

    # 6: progress shows the conditions as they change, ending with all Ready, and the first
    # Ready screen is all True: DagBundleInSync too (the DagBundle is registered), no
    # Reconciling or Stalled.
    for name in NAMES:
        ready = re.search(rf"^\s+\d+\.\d s  {name}: (Ready=True \(Succeeded\).*)$", demo.out, re.M)
        assert ready is not None, demo.section("6")
        shown = dict(re.findall(r"(\w+)=(\w+) \(\w+\)", ready.group(1)))
        assert shown == dict.fromkeys(ALL_TRUE, "True"), ready.group(1)
        assert "DagBundleInSync=True (InSync)" in ready.group(1)
    assert "UnknownDagBundle" not in demo.out
    assert re.search(r"^all 3 bundles Ready in \d+\.\d s$", demo.section("6"), re.M)

    # 7: kubectl get thb shows the three bundles Ready, then the scheduler's bindings.
    rows = demo.section("7")
    table = rows.split("$ kubectl get thb -n thop-demo -o wide")[0]
    assert re.search(
        r"^\s+NAME\s+LANGUAGE\s+QUEUES\s+READY\s+REVISION\s+HANDLERS\s+BINDINGS\s+AGE$", table, re.M
    ), table
    for name, language in zip(NAMES, LANGUAGES, strict=True):
        # The queue as a plain word, the revision short as Flux prints it.
        assert re.search(
            rf"^\s+{name}\s+{language}\s+{language}\s+True\s+main@sha1:[0-9a-f]{{8}}\s+1\s+1\s",
            table,
            re.M,
        ), table
    # -o wide: Suspended and the full revision (the commit and a digest of the path).
    wide = rows.split("$ kubectl get thb -n thop-demo -o wide")[1].split("$ kubectl describe")[0]
    assert re.search(r"\sAGE\s+SUSPENDED\s+FULL REVISION\s+REASON\s+MESSAGE$", wide, re.M), wide
    for name in NAMES:
        assert re.search(
            rf"^\s+{name}\s.*\sfalse\s+[0-9a-f]{{40}}-[0-9a-f]{{12}}\s+Succeeded\s", wide, re.M
        ), wide
    # kubectl describe: every condition True.
    described = rows.split("$ kubectl describe thb orders-go -n thop-demo")[1]
    assert conditions_described(described) == dict.fromkeys(ALL_TRUE, "True"), described
    for task_id, target in BINDINGS:
        assert re.search(rf"^\s+orders_etl\.{task_id}\s+-> {re.escape(target)}$", rows, re.M)

    # 8: how to try things, with the kubeconfig path to export.
    try_it = demo.section("8")
    kubeconfig = re.search(r"^\s+export KUBECONFIG=(\S+)$", try_it, re.M)
    assert kubeconfig is not None, try_it
    for line in (
        "kubectl get thb -A",
        "kubectl describe thb orders-go -n thop-demo",
        "kubectl annotate thb orders-go -n thop-demo --overwrite "
        'langsdk.dev/reconcile-requested-at="$(date -u +%FT%TZ)"',
        "--once: shutting down now",
    ):
        assert line in try_it

    # 9: everything stopped and removed: helm release, cluster folder, work folder.
    shutdown = demo.section("9")
    for line in (
        "helm uninstall thop: done",
        f"stop the control plane and the {demo.node} node: done",
        "stop PostgreSQL: done",
        "$DEMO removed: yes",
    ):
        assert line in shutdown.splitlines(), shutdown
    assert not Path(kubeconfig.group(1)).parent.exists()
    assert not work_folder(demo.out).exists()
    assert list(demo.tmp.glob("thop-demo-*")) == []
    assert demo.out.rstrip().splitlines()[-1] == (
        "demo OK: 3 bundles Ready, 3 stub tasks bound across Go, Java and TypeScript"
    )


@pytest.mark.parametrize("document", ["README.md", "docs/demo.md"])
def test_the_quoted_output_is_what_the_demo_prints(demo: DemoRun, document: str) -> None:
    assert demo.returncode == 0, demo.out[-6000:]
    missing = [
        line
        for line in quoted_lines(REPO_ROOT / document)
        if not line_pattern(line).search(demo.out)
    ]
    assert missing == [], f"{document} quotes lines the demo does not print:\n" + "\n".join(missing)


def test_a_failing_step_is_named_and_everything_is_removed(tmp_path: Path) -> None:
    no_postgres = tmp_path / "no-postgres"
    # Forced to fall back: the real node's binaries are not where the check looks.
    no_node_bins = tmp_path / "no-node-bins"
    no_node_bins.mkdir()
    run = run_demo(tmp_path, THOP_PG_BIN=str(no_postgres), NODE_BINS=str(no_node_bins))
    assert run.returncode == 1, run.out[-4000:]
    lines = run.out.splitlines()
    fallback = [line for line in lines if line.startswith("node: ")]
    assert len(fallback) == 1 and fallback[0].startswith("node: process (fallback: "), fallback
    if machine_runs_real_node():
        assert fallback == [
            f"node: process (fallback: node binaries not built in {no_node_bins}: "
            "run `make node-bins`)"
        ]
    assert any(
        re.match(r"=== 2\. Start the local control plane with the process node =+$", line)
        for line in lines
    )
    assert "demo FAILED in step 3. PostgreSQL with Airflow's schema and the Dag orders_etl" in lines
    assert (
        "  PostgresBinariesMissing: PostgreSQL server binaries not found: "
        f"THOP_PG_BIN={no_postgres} lacks initdb, pg_ctl, postgres; install them with "
        "`apt-get install postgresql` or point THOP_PG_BIN at their bin dir"
    ) in lines
    assert "stop the control plane and the process node: done" in lines
    assert "$DEMO removed: yes" in lines
    assert not work_folder(run.out).exists()
    assert list(tmp_path.glob("thop-demo-*")) == []
