"""SIGKILL of the operator at random moments of a cold start.

What it proves: a ``taskhandler-operator run`` killed with SIGKILL at any moment of a bundle's
first pass (syncing, creating probe Jobs, waiting for them, writing) and started again with the
same settings (a restarted pod: same revision store, signing key and artifact-server address)
ends with exactly the database rows of an undisturbed run (bindings, artifact rows with their
answers, no problem), and no artifact was ever probed by two Jobs: a watch on the apiserver
records every Job ADDED in the namespace for the whole run, and each artifact has one uid
(the restarted operator adopts the Jobs of the killed one).

How: one undisturbed cold start of a Go bundle of 6 artifacts at ``probe.parallelism: 2``
(three waves of probe Jobs) gives the reference rows and its duration T; then each iteration
runs the same cold start in a fresh namespace and database and kills the operator at a moment
drawn uniformly from [0, 0.6 T) after the bundle is applied (a kill that lands after the pass
is still made, and counted as such in the output) (seeded: the seed is printed,
``THOP_CHAOS_SEED`` replays it). The restarted operator waits for the killed one's Lease to
expire (15 s) before it reconciles.

Run: the 3-iteration variant is part of the default suite; the 20-iteration one is marked
``chaos``::

    make chaos                                         # everything in tests/chaos
    .venv/bin/pytest -m chaos tests/chaos/test_operator_kill.py   # the 20 iterations only
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import pytest

from taskhandler_devenv.kubecluster.control_plane import KubeCluster
from tests.chaos.conftest import FreshNamespace, StartBundleRun
from tests.chaos.harness import (
    JobRecorder,
    artifact_of,
    diagnose,
    many_artifacts_repo,
    replay_hint,
    wait_ready,
)
from tests.e2e.faults_support import Replica, condition, rows, thb
from tests.fixtures.runtimes_plugin import RuntimeFactory
from tests.fixtures.sources import GitRepo, HttpServer

pytestmark = [
    pytest.mark.kube,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("thb_crd"),
]

ARTIFACTS = 6
PARALLELISM = 2
BUNDLE = "chaos-kill"


@dataclass
class ColdStart:
    namespace: str
    rows: dict[str, list[tuple[Any, ...]]]
    seconds: float
    recorder: JobRecorder
    replica: Replica
    killed_at: float | None
    mid_pass: bool


@pytest.mark.parametrize(
    "iterations",
    [
        pytest.param(3, id="3-kills", marks=pytest.mark.timeout(900)),
        pytest.param(20, id="20-kills", marks=[pytest.mark.chaos, pytest.mark.timeout(3600)]),
    ],
)
def test_sigkill_at_random_moments_of_a_cold_start_changes_nothing(
    iterations: int,
    kube_cluster: KubeCluster,
    git_repo: GitRepo,
    source_http: HttpServer,
    runtime_factory: RuntimeFactory,
    fresh_namespace: FreshNamespace,
    bundle_run: StartBundleRun,
    chaos_rng: random.Random,
) -> None:
    url = many_artifacts_repo(git_repo, runtime_factory, ARTIFACTS).http_url(source_http)

    def cold_start(run: str, kill_at: float | None) -> ColdStart:
        """One cold start in a fresh namespace and database; SIGKILL ``kill_at`` seconds after
        the bundle is applied, then start the operator again at once."""
        namespace = fresh_namespace()
        database, recorder, op, more = bundle_run(
            namespace,
            url,
            bundle=BUNDLE,
            artifacts=ARTIFACTS,
            parallelism=PARALLELISM,
            run=run,
            note=lambda: f"run {run} (kill at {kill_at}):\n",
        )
        applied = time.monotonic()
        mid_pass = False
        if kill_at is not None:
            time.sleep(max(0.0, applied + kill_at - time.monotonic()))
            # A moment after the pass finished still kills, but is reported as such.
            ready = condition(thb(kube_cluster, namespace, BUNDLE), "Ready")
            mid_pass = ready.get("status") != "True"
            op.kill()
            assert op.proc is not None and op.proc.returncode == -9, more()
            op.start()  # the same settings: a restarted pod
        status = wait_ready(kube_cluster, namespace, BUNDLE, more)["status"]
        seconds = time.monotonic() - applied
        assert status["counts"]["bindings"] == ARTIFACTS, more()
        state = rows(database)
        # Stop the operator gracefully (the Lease is released) before the next run starts.
        op.stop()
        recorder.stop()
        return ColdStart(namespace, state, seconds, recorder, op, kill_at, mid_pass)

    reference = cold_start("undisturbed", None)
    assert len(reference.rows["bindings"]) == ARTIFACTS, reference.rows
    assert reference.rows["problems"] == []
    assert not reference.recorder.duplicates(), reference.recorder.summary()
    print(f"undisturbed cold start: {reference.seconds:.1f}s")

    mid_pass = 0
    for index in range(iterations):
        # The undisturbed run warmed the node's caches, so later passes are quicker (on an idle
        # machine about 60% of it): draw from that part to land (nearly always) inside the pass.
        kill_at = chaos_rng.uniform(0.0, 0.6 * reference.seconds)
        run = cold_start(f"kill-{index}", kill_at)
        mid_pass += run.mid_pass
        print(
            f"iteration {index}: SIGKILL at {kill_at:.1f}s "
            f"({'mid-pass' if run.mid_pass else 'after the pass'}), "
            f"Ready after {run.seconds:.1f}s, {len(run.recorder.seen)} Jobs"
        )
        context = (
            f"iteration {index}, SIGKILL {kill_at:.2f}s after apply ({replay_hint()})\n"
            + diagnose(kube_cluster, run.namespace, [BUNDLE], [run.replica], run.recorder)
        )
        assert run.rows == reference.rows, context
        assert not run.recorder.duplicates(), context
        probed = {artifact for _, artifact in run.recorder.by_artifact()}
        assert probed == {artifact_of(i) for i in range(ARTIFACTS)}, context
    print(f"{mid_pass} of {iterations} kills landed mid-pass")
