"""The ``orders_etl`` example in a cluster: the manifests ``make kind-examples`` applies to a
kind cluster and ``make demo`` applies to its local control plane (development only).

``hack/kind/examples/`` holds them: ``namespace.yaml`` (the bundles' namespace, Pod Security
``restricted``), ``git-server.yaml`` (a git server over smart HTTP running the operator image,
its repository pushed to through the Service) and ``bundles.yaml`` (the three
TaskHandlerBundles reading it with the Secret ``git-auth``). One file set for both, so the
demo's end-to-end test proves what a kind user applies. The process node has no cluster DNS
and no Service proxy (its pods share the host's network), so for it :func:`on_process_node`
changes exactly the server's listen address and port and the bundles' URL; nothing else. The
real node has neither either: :func:`on_real_node` changes exactly the server's image (the
locally built one, never pulled) and the bundles' URL (the server pod's address).

Also here, shared by both paths: the Dag's seeding (:func:`seed_orders_dag`: ``airflow db
migrate``, ``airflow dags reserialize`` of ``orders_etl``, the stub fields) and the push of the
three built test runtimes (:func:`push_bundles`). As a command, for the kind path::

    python -m taskhandler_devenv.orders_cluster seed --database-url URL
    THOP_GIT_PASSWORD=... python -m taskhandler_devenv.orders_cluster push --url URL
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import yaml

from taskhandler_devenv.git_server import GIT, GIT_IDENTITY, GitCommandError, run_git
from taskhandler_devenv.orders_example import (
    BUNDLES,
    DAG_FILE,
    DAG_ID,
    DAG_SOURCE,
    STUB_ARGUMENTS,
    register_bundles,
)
from taskhandler_devenv.postgres import (
    AIRFLOW_VERSION,
    AirflowCli,
    airflow_venv_path,
    reserialize_dags,
)
from taskhandler_devenv.serialized_dags import add_stub_fields
from taskhandler_operator.db.engine import create_sync_engine
from taskhandler_operator.kube import names

Obj = dict[str, Any]

MANIFESTS: Final = Path(__file__).resolve().parents[2] / "hack" / "kind" / "examples"
NAMESPACE: Final = "thop-demo"
GIT_SECRET: Final = "git-auth"  # noqa: S105 - a Secret's name
GIT_USER: Final = "demo"
SERVER: Final = "bundle-git-server"
SERVER_LISTEN: Final = "0.0.0.0:8080"  # in its own pod, behind its Service
REPOSITORY: Final = "orders-bundles"
SERVICE_URL: Final = f"http://{SERVER}.{NAMESPACE}.svc.cluster.local/{REPOSITORY}.git"
PASSWORD_ENV: Final = "THOP_GIT_PASSWORD"  # noqa: S105 - the variable's name


def load(name: str) -> list[Obj]:
    """The documents of ``hack/kind/examples/<name>.yaml``."""
    text = (MANIFESTS / f"{name}.yaml").read_text(encoding="utf-8")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def git_secret(password: str, namespace: str = NAMESPACE) -> Obj:
    """The Secret ``git-auth``: the git server's credentials and the bundles' secretRef."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": GIT_SECRET, "namespace": namespace},
        "stringData": {"username": GIT_USER, "password": password},
    }


def on_process_node(objects: Sequence[Obj], port: int) -> list[Obj]:
    """The same objects for the process node: the server listens on loopback ``port`` and the
    bundles fetch from there."""
    out = []
    for original in objects:
        obj = copy.deepcopy(original)
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == SERVER:
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            container["args"] = [
                f"127.0.0.1:{port}" if arg == SERVER_LISTEN else arg for arg in container["args"]
            ]
            (container_port,) = container["ports"]
            container_port["containerPort"] = port
            container["readinessProbe"]["httpGet"]["port"] = port
        elif obj["kind"] == names.KIND:
            git = obj["spec"]["source"]["git"]
            git["url"] = git["url"].replace(
                SERVICE_URL, f"http://127.0.0.1:{port}/{REPOSITORY}.git"
            )
        out.append(obj)
    return out


def on_real_node(objects: Sequence[Obj], image: str, server_url: str | None = None) -> list[Obj]:
    """The same objects for the demo's real node: the server runs the locally built operator
    ``image`` (``imagePullPolicy: Never``, there is no registry) and, as that node has neither
    cluster DNS nor kube-proxy, the bundles fetch from ``server_url`` (the server pod's own
    address) when given."""
    out = []
    for original in objects:
        obj = copy.deepcopy(original)
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == SERVER:
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            container["image"] = image
            container["imagePullPolicy"] = "Never"
        elif obj["kind"] == names.KIND and server_url is not None:
            git = obj["spec"]["source"]["git"]
            git["url"] = git["url"].replace(SERVICE_URL, server_url)
        out.append(obj)
    return out


def as_list(objects: Sequence[Obj]) -> str:
    """One ``kubectl apply -f -`` input."""
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})


# -- the artifacts ---------------------------------------------------------------------------


def bundle_files(artifacts: Mapping[str, bytes]) -> dict[str, bytes]:
    """Repository path → content: ``<language>/<rel_path>`` (each bundle's ``path``)."""
    return {f"{b.language.value}/{b.rel_path}": artifacts[b.name] for b in BUNDLES}


def build_artifacts(report: Callable[[str], None] = print) -> dict[str, bytes]:
    """The three test runtimes with the example's handlers (built with go, javac and node)."""
    from taskhandler_devenv.runtimes import build_runtime

    artifacts = {}
    for bundle in BUNDLES:
        started = time.monotonic()
        artifacts[bundle.name] = build_runtime(bundle.language.value, bundle.handlers).read_bytes()
        report(
            f"test runtime {bundle.language.value:<10} {bundle.rel_path:<21} "
            f"{len(artifacts[bundle.name]):>9,} bytes  {time.monotonic() - started:.1f} s"
        )
    return artifacts


def push_bundles(
    url: str, username: str, password: str, files: Mapping[str, bytes], scratch: Path
) -> str:
    """Commit ``files`` on ``main`` of a new work tree in ``scratch`` and force-push it to
    ``url`` with basic auth; returns the commit. The credentials reach git in its environment
    (an extra header), never in an argument list or a file."""
    work = scratch / f"{REPOSITORY}-work"
    run_git("init", "-q", "-b", "main", str(work))
    go = next(b for b in BUNDLES if b.language.value == "go")
    for rel, content in files.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        if rel == f"go/{go.rel_path}":
            path.chmod(0o755)  # a Go artifact is an executable
    run_git("add", "-A", cwd=work)
    run_git("commit", "-q", "-m", "three example bundles", cwd=work)
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    env = {
        **os.environ,
        **GIT_IDENTITY,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {token}",
    }
    done = subprocess.run(
        [GIT, "push", "-q", "--force", url, "main:refs/heads/main"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise GitCommandError(f"git push to {url} failed: {done.stderr.strip()}")
    return run_git("rev-parse", "HEAD", cwd=work)


# -- the Dag ---------------------------------------------------------------------------------


def seed_orders_dag(
    airflow: AirflowCli, url: str, dags: Path, report: Callable[[str], None] = print
) -> None:
    """Airflow's schema (``airflow db migrate``), the Dag ``orders_etl`` written by Airflow
    (``airflow dags reserialize``) and the stub fields newer Airflow serializes, at ``url``."""
    started = time.monotonic()
    airflow(url, "db", "migrate", timeout=300)
    report(f"airflow db migrate (Airflow {AIRFLOW_VERSION}): {time.monotonic() - started:.1f} s")
    dags.mkdir(parents=True, exist_ok=True)
    (dags / DAG_FILE).write_text(DAG_SOURCE, encoding="utf-8")
    started = time.monotonic()
    reserialize_dags(airflow, dags, url)
    report(
        f"airflow dags reserialize wrote Dag {DAG_ID} from {DAG_FILE}: "
        f"{time.monotonic() - started:.1f} s"
    )
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            for task_id, arguments in STUB_ARGUMENTS.items():
                add_stub_fields(conn, DAG_ID, task_id, arg_bindings=arguments)
    finally:
        engine.dispose()
    report(
        "stub tasks (is_stub and _arg_bindings added to Airflow's row): "
        + ", ".join(STUB_ARGUMENTS)
    )


# -- the command -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taskhandler_devenv.orders_cluster")
    commands = parser.add_subparsers(dest="command", required=True)
    seed = commands.add_parser("seed", help="Airflow's schema and the Dag orders_etl")
    seed.add_argument("--database-url", required=True, help="SQLAlchemy URL (psycopg)")
    push = commands.add_parser("push", help="build the three test runtimes and push them")
    push.add_argument("--url", required=True, help=f"the repository, e.g. .../{REPOSITORY}.git")
    push.add_argument("--username", default=GIT_USER)
    push.add_argument(
        "--database-url",
        help="also register the bundles in Airflow's dag_bundle table at the pushed commit, as "
        "Airflow's dag processor would (without it they report UnknownDagBundle)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="thop-orders-") as scratch:
        if args.command == "seed":
            seed_orders_dag(
                AirflowCli(airflow_venv_path()), args.database_url, Path(scratch) / "dags"
            )
            return 0
        password = os.environ.get(PASSWORD_ENV)
        if not password:
            parser.error(f"set {PASSWORD_ENV} to the password of the Secret {GIT_SECRET}")
        files = bundle_files(build_artifacts())
        commit = push_bundles(args.url, args.username, password, files, Path(scratch))
        print(f"pushed {', '.join(sorted(files))} to main at {commit[:12]}")
        if args.database_url:
            engine = create_sync_engine(args.database_url)
            try:
                with engine.begin() as conn:
                    register_bundles(conn, commit, datetime.now(UTC))
            finally:
                engine.dispose()
            print(f"registered {', '.join(b.name for b in BUNDLES)} in dag_bundle at {commit[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
