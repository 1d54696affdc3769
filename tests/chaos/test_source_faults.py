"""Chaos: a source server that fails — answers 500, cuts a .tar.gz off halfway, or hangs.

What it proves: on the real operator (``taskhandler-operator run`` under its least-privilege
identity, the real control plane + process node, PostgreSQL with Airflow's schema), an ``http``
bundle made Ready from a good server, whose server then misbehaves, gets for each fault a pass
(asked for with the reconcile-now annotation) that ends within the bundle's source timeout
(``spec.timeout``, plus one pass already in flight and a slack), a ``SourceReady=False``
condition naming the problem (``HttpFetchFailed`` with ``HTTP 500`` or the incomplete payload;
``SourceTimeout`` for the hang), the same revision and published revision in status, the same
binding rows, and a revision store holding the last revision and no partial one. Once the
server heals, the bundle is Ready again on the same revision, without a new probe Job.

The same for a ``git`` bundle over smart HTTP behind a TCP proxy that answers 500, cuts an
answer's body in half, or hangs: ``GitFetchFailed`` naming git's error (``500``, ``transfer
closed``) or ``SourceTimeout``, the revision and bindings kept, and every git process a failed
sync started gone within two source timeouts (the sync kills git's process group).

The server and the proxy are in ``tests/chaos/faulty_server.py`` (threads, mode switched at
runtime).

Run: ``.venv/bin/pytest tests/chaos/test_source_faults.py`` (about 2 minutes for both; in the
default suite, markers kube/integration/slow).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.chaos.faulty_server import FaultyProxy, FaultyServer, Mode, ProxyMode
from tests.chaos.input_faults import (
    ARTIFACT,
    assert_source_failed_and_kept,
    diagnose,
    handled,
    ready,
    ready_http_bundle,
    request_pass,
    start_replica,
    store_entries,
    wait_until,
)
from tests.chaos.input_faults import faulty_server as faulty_server
from tests.chaos.input_faults import go_artifact as go_artifact
from tests.chaos.input_faults import replicas as replicas
from tests.e2e.faults_support import Replica, condition, jobs_by_name, rows, wait_for
from tests.e2e.operator_env import apply, commit_files, git_bundle
from tests.e2e.test_operator import database as database
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

NAME = "orders-http"
#: The bundle's source timeout (spec.timeout): short, so the hang is cut by it and not by the
#: HTTP client's own 60 s read timeout.
TIMEOUT_SECONDS = 6
#: Room for the watch event, the status write and the polling (not for the fetch itself).
SLACK_SECONDS = 30

#: What the SourceReady condition says for each fault: its reason and words in its message.
EXPECTED: dict[Mode, tuple[str, tuple[str, ...]]] = {
    "error": ("HttpFetchFailed", ("HTTP 500",)),
    "truncate": ("HttpFetchFailed", ("payload is not completed",)),
    "hang": ("SourceTimeout", (f"did not finish within {TIMEOUT_SECONDS}s",)),
}


def bounded_pass(
    cluster: KubeCluster, namespace: str, op: Replica, mode: str, token: str
) -> tuple[dict[str, Any], str]:
    """Ask for a pass (``token``) and wait until it is handled, within the bound; the bundle
    and the failure report."""
    asked = request_pass(cluster, namespace, NAME, token)
    # A retry pass may already be running against the fault when the request comes:
    # the requested pass starts after it, so two source timeouts bound the wait.
    bound = 2 * TIMEOUT_SECONDS + SLACK_SECONDS
    failed = wait_until(cluster, namespace, NAME, op, f"handled the {mode} pass", handled(token))
    took = time.monotonic() - asked
    more = diagnose(cluster, namespace, NAME, op)
    assert took <= bound, f"the {mode} pass took {took:.1f}s, over {bound}s\n{more}"
    return failed, more


def test_a_failing_source_server_is_bounded_keeps_the_revision_and_heals(
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    faulty_server: FaultyServer,
    go_artifact: bytes,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    store = tmp_path / "operator" / "revisions"
    op, sha, good, state, kept, jobs = ready_http_bundle(
        replicas,
        kube_cluster,
        namespace,
        database,
        faulty_server,
        NAME,
        {ARTIFACT: go_artifact},
        archive_name="orders.tar.gz",
        store=store,
        workdir=tmp_path / "operator",
        timeout=f"{TIMEOUT_SECONDS}s",
    )

    for mode, (reason, words) in EXPECTED.items():
        faulty_server.set_mode(mode)
        before = faulty_server.requests[mode]
        failed, more = bounded_pass(kube_cluster, namespace, op, mode, f"fault-{mode}")
        assert faulty_server.requests[mode] > before, f"the server never saw the {mode}\n{more}"

        # The last revision and its bindings stay, in status, in the database and on disk.
        assert_source_failed_and_kept(failed, reason, words, good, state, database, more)
        assert condition(failed, "Ready").get("status") == "False", more
        assert store_entries(store, namespace, NAME) == kept, more  # no half revision
        assert (store / namespace / NAME / sha / ARTIFACT).is_file(), more

    faulty_server.set_mode("ok")
    request_pass(kube_cluster, namespace, NAME, "healed")
    healed = wait_until(
        kube_cluster,
        namespace,
        NAME,
        op,
        "Ready after the server healed",
        lambda obj: handled("healed")(obj) and condition(obj, "Ready").get("status") == "True",
    )
    more = diagnose(kube_cluster, namespace, NAME, op)
    assert condition(healed, "SourceReady").get("reason") == "Synced", more
    assert healed["status"]["revision"] == good["revision"], more
    assert rows(database) == state, more
    assert jobs_by_name(kube_cluster, namespace) == jobs, more  # the answer was kept


# --- git over smart HTTP, behind a faulting proxy -------------------------------------------------

GIT_EXPECTED: dict[ProxyMode, tuple[str, tuple[str, ...]]] = {
    "error": ("GitFetchFailed", ("500",)),
    "cut": ("GitFetchFailed", ("transfer closed",)),
    "hang": ("SourceTimeout", (f"did not finish within {TIMEOUT_SECONDS}s",)),
}


def git_pids(port: int) -> set[int]:
    """git processes (any of git's helpers) talking to 127.0.0.1:``port``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and b"git" in Path(argv[0].decode(errors="replace")).name.encode()
            and any(f"127.0.0.1:{port}/".encode() in a for a in argv)
        ):
            found.add(int(entry.name))
    return found


def outlive(running: set[int], port: int, seconds: float, op: Replica) -> None:
    """Wait until none of the git processes ``running`` runs any more (bounded)."""

    def ended() -> bool:
        return not running & git_pids(port)

    wait_for(
        "the git processes of the failed syncs to end",
        ended,
        seconds,
        more=lambda: f"{running & git_pids(port)} still run\n{op.tail()}",
    )


def test_a_failing_git_server_is_bounded_kills_git_keeps_the_revision_and_heals(
    kube_cluster: KubeCluster,
    namespace: str,
    database: str,
    git_repo: GitRepo,
    source_http: HttpServer,
    go_artifact: bytes,
    replicas: list[Replica],
    tmp_path: Path,
) -> None:
    commit_files(git_repo, {f"go/{ARTIFACT}": go_artifact}, "the go bundle")
    with FaultyProxy(source_http.port) as proxy:
        url = git_repo.http_url(source_http).replace(f":{source_http.port}/", f":{proxy.port}/", 1)
        op = start_replica(replicas, kube_cluster, namespace, database, tmp_path / "operator")
        apply(
            kube_cluster,
            git_bundle(
                namespace,
                NAME,
                language="go",
                url=url,
                path="go",
                queues=["go"],
                timeout=f"{TIMEOUT_SECONDS}s",
            ),
        )
        good = ready(kube_cluster, namespace, NAME, op)["status"]
        state = rows(database)
        assert len(state["bindings"]) == 1, state
        jobs = jobs_by_name(kube_cluster, namespace)

        for mode, (reason, words) in GIT_EXPECTED.items():
            proxy.set_mode(mode)
            before = proxy.connections[mode]
            failed, more = bounded_pass(kube_cluster, namespace, op, mode, f"git-{mode}")
            assert proxy.connections[mode] > before, f"git never met the {mode}\n{more}"
            assert_source_failed_and_kept(failed, reason, words, good, state, database, more)
            # Every git process a sync started ends with it (killed at the timeout at the
            # latest), however the server misbehaves: none outlives two timeouts.
            outlive(git_pids(proxy.port), proxy.port, 2 * TIMEOUT_SECONDS + 10, op)

        proxy.set_mode("ok")
        request_pass(kube_cluster, namespace, NAME, "git-healed")
        healed = wait_until(
            kube_cluster,
            namespace,
            NAME,
            op,
            "Ready after the git server healed",
            lambda obj: (
                handled("git-healed")(obj) and condition(obj, "Ready").get("status") == "True"
            ),
        )
        more = diagnose(kube_cluster, namespace, NAME, op)
        assert healed["status"]["revision"] == good["revision"], more
        assert rows(database) == state, more
        assert jobs_by_name(kube_cluster, namespace) == jobs, more
