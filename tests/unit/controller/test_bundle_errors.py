"""No error escapes a pass (controller/bundle.py), and the status is written against the live
object: the pass loop with the real reconcile code, a fault injected in it, and an in-memory
apiserver that stores the status as a merge patch would (the real apiserver and PostgreSQL are
in tests/e2e/test_operator_health.py)."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from taskhandler_operator.controller import bundle as bundle_module
from taskhandler_operator.controller.backoff import PassGate
from taskhandler_operator.controller.bundle import (
    BundleInputs,
    BundleMemory,
    LiveStatus,
    run_bundle,
)
from taskhandler_operator.controller.health import PassWatch
from taskhandler_operator.controller.kubeapi import merge_patch_to
from taskhandler_operator.reconcile.local import LocalFolderSyncer
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.reconcile.steps import PassOutcome, PassPorts
from taskhandler_operator.reconcile.steps import run_pass as real_run_pass
from taskhandler_operator.sources.access import VolumeAccess
from tests.unit.reconcile.test_steps import SPEC, FakeProber, FakeStore, etl, handler
from tests.unit.reconcile.test_steps import bundle as bundle  # the fixture: a bundle folder

ANSWERS: dict[str, dict[str, Any] | str] = {
    "extract.min.mjs": {"etl": [handler("extract")]},
    "load.min.mjs": {"etl": [handler("load")]},
}


PROBER: contextvars.ContextVar[FakeProber] = contextvars.ContextVar("prober")


class FakeApiserver:
    """One TaskHandlerBundle: its status is changed only by merge patches (RFC 7386), each
    bumping ``resourceVersion``, as the apiserver does; ``body()`` is the watched object."""

    def __init__(self) -> None:
        self.version = 1
        self.status: dict[str, Any] | None = None
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def body(self) -> dict[str, Any]:
        return {
            "metadata": {
                "namespace": "team",
                "name": "ts",
                "uid": "uid-1",
                "generation": 1,
                "resourceVersion": str(self.version),
            },
            "spec": {
                "bundleName": "ts",
                "language": "typescript",
                "queues": ["typescript"],
                "source": {"volume": {"path": "/srv/bundle"}},
                "interval": "10m",
            },
            "status": copy.deepcopy(self.status),
        }

    def set_status(self, status: dict[str, Any]) -> None:
        """Someone else's write (``kubectl patch --subresource=status``)."""
        self.status = copy.deepcopy(status)
        self.version += 1

    async def patch_bundle_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, previous: Any = None
    ) -> dict[str, Any]:
        patch = dict(status) if previous is None else merge_patch_to(previous, status)
        self.patches.append(patch)
        self.status = _merge(self.status or {}, patch)
        self.version += 1
        return self.body()

    async def post_event(self, regarding: Any, *, reason: str, note: str, type: str) -> None:
        self.events.append((type, reason))


def _merge(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Metrics:
    def __init__(self) -> None:
        self.outcomes: list[str] = []

    def observe_reconcile(self, namespace: str, name: str, outcome: str, seconds: float) -> None:
        self.outcomes.append(outcome)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Wakeup:
    def __init__(self, passes: int) -> None:
        self.left = passes
        self.sleeps: list[float] = []

    def collect(self) -> None:
        pass

    async def sleep_or_wake(self, seconds: float) -> tuple[str, ...]:
        self.sleeps.append(seconds)
        self.left -= 1
        return ()


def runtime(api: FakeApiserver, wakeup: Wakeup) -> Any:
    nothing = SimpleNamespace(forget=lambda *a: None, serve=lambda *a: None, store=None)
    return SimpleNamespace(
        kube=api,
        metrics=Metrics(),
        wakeups=SimpleNamespace(get=lambda ns, name: wakeup, discard=lambda ns, name: None),
        reconciler_heartbeat=PassWatch("reconcilers", 60.0),
        whole_passes=PassGate(),
        poller=nothing,
        slots=nothing,
        revisions=None,
        artifacts=None,
        signals=None,
        engine=None,
        runtime_images={},
        options=SimpleNamespace(cluster_id="c1", operator_image="img", pod_settings=None),
        settings=SimpleNamespace(pass_timeout=None, publication_history=20),
        fence=None,
        volumes=VolumeAccess(),
    )


def conditions(api: FakeApiserver) -> dict[str, tuple[str, str, str]]:
    found = (api.status or {}).get("conditions") or ()
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in found}


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch, bundle: Path) -> list[str]:
    """The pass's run_pass_or_keep: the real run_pass on a local folder, but raising an
    unexpected error (a bug outside any step) while ``script`` says ``"fail"``."""
    script: list[str] = []
    store = FakeStore(etl("extract", "load"))
    (bundle / "broken.min.mjs").unlink()  # every artifact answers

    async def run_pass(spec: BundleSpec, ports: PassPorts) -> PassOutcome:
        if script.pop(0) == "fail":
            raise RuntimeError("boom in the pass\nsecond line of the message")
        local = PassPorts(
            LocalFolderSyncer(bundle),
            PROBER.get(FakeProber(ANSWERS)),
            store,
            progress=ports.progress,
        )
        return await real_run_pass(SPEC, local)

    monkeypatch.setattr(bundle_module, "run_pass_or_keep", run_pass)
    return script


def test_an_unexpected_error_becomes_internal_error_and_the_loop_recovers(
    passes: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    passes.extend(["fail", "fail", "ok"])
    api, wakeup = FakeApiserver(), Wakeup(passes=3)
    rt = runtime(api, wakeup)
    seen: list[dict[str, tuple[str, str, str]]] = []

    real_sleep = wakeup.sleep_or_wake

    async def sleep_or_wake(seconds: float) -> tuple[str, ...]:
        seen.append(conditions(api))
        return await real_sleep(seconds)

    wakeup.sleep_or_wake = sleep_or_wake  # type: ignore[method-assign]
    asyncio.run(run_bundle(api.body, rt, lambda: wakeup.left <= 0))

    # The loop went on after each failure, instead of dying with the exception.
    assert len(seen) == 3
    first = seen[0]
    assert first["Ready"][:2] == ("False", "InternalError")
    assert first["Ready"][2].startswith("RuntimeError: boom in the pass; retried with back-off")
    assert first["Reconciling"][:2] == ("True", "ProgressingWithRetry")
    assert ("Warning", "InternalError") in api.events
    # Retried with the back-off (5 s base, decorrelated jitter), not the 10 m interval.
    assert bundle_module.RETRY.base <= wakeup.sleeps[0] <= 3 * bundle_module.RETRY.base
    assert bundle_module.RETRY.base <= wakeup.sleeps[1] <= 9 * bundle_module.RETRY.base
    assert rt.metrics.outcomes[:2] == ["operator", "operator"]
    # Logged with the traceback.
    failed = [r for r in caplog.records if "failed (RuntimeError)" in r.getMessage()]
    assert failed and failed[0].exc_info is not None
    # The next good pass heals it, and sleeps the interval again.
    assert seen[2]["Ready"][:2] == ("True", "Succeeded")
    assert "Reconciling" not in seen[2]
    assert wakeup.sleeps[2] > 300


def test_a_status_changed_by_someone_else_is_restored_by_the_next_pass(
    passes: list[str],
) -> None:
    passes.extend(["ok", "ok", "ok"])
    api, wakeup = FakeApiserver(), Wakeup(passes=3)
    rt = runtime(api, wakeup)
    restored: list[dict[str, Any] | None] = []
    real_sleep = wakeup.sleep_or_wake

    async def sleep_or_wake(seconds: float) -> tuple[str, ...]:
        restored.append(copy.deepcopy(api.status))
        if len(restored) == 1:
            # kubectl patch --subresource=status, between two passes.
            tampered = copy.deepcopy(api.status) or {}
            tampered["counts"]["bindings"] = 99
            tampered["conditions"] = [c for c in tampered["conditions"] if c["type"] != "Ready"]
            tampered["problems"] = [{"severity": "error", "kind": "x", "message": "fake"}]
            api.set_status(tampered)
        return await real_sleep(seconds)

    wakeup.sleep_or_wake = sleep_or_wake  # type: ignore[method-assign]
    asyncio.run(run_bundle(api.body, rt, lambda: wakeup.left <= 0))

    good, after, third = restored
    assert good is not None and after is not None
    # Every field someone else changed is what the pass observed again.
    assert after["counts"]["bindings"] == good["counts"]["bindings"] == 2
    ready = [c for c in after["conditions"] if c["type"] == "Ready"]
    assert [(c["status"], c["reason"]) for c in ready] == [("True", "Succeeded")]
    assert "problems" not in after or after["problems"] == []
    assert third == after
    # Probing and Ready of the first pass, the restore; the third pass wrote nothing.
    assert len(api.patches) == 3


def test_the_own_write_counts_until_the_watch_delivers_it() -> None:
    live = LiveStatus()
    body = {"metadata": {"resourceVersion": "5", "namespace": "n", "name": "b"}, "status": {"a": 1}}
    inputs = BundleInputs.from_body(body)
    assert live.current(inputs) == ({"a": 1}, "5")
    live.wrote("5", {"metadata": {"resourceVersion": "6"}, "status": {"a": 2}})
    # The watch still shows 5: our write (6) is newer.
    assert live.current(inputs) == ({"a": 2}, "6")
    live.wrote("6", {"metadata": {"resourceVersion": "7"}, "status": {"a": 3}})
    assert live.current(BundleInputs.from_body({**body, "metadata": {"resourceVersion": "6"}}))[
        0
    ] == {"a": 3}
    # Anything else the watch shows is newer than what we know: it wins, ours is forgotten.
    later = {**body, "metadata": {"resourceVersion": "9"}, "status": {"a": 9}}
    assert live.current(BundleInputs.from_body(later)) == ({"a": 9}, "9")
    assert live.status is None and live.superseded == frozenset()
    assert BundleMemory().live.status is None


class WatchingProber(FakeProber):
    """Records what the apiserver held while each probe ran."""

    def __init__(self, api: FakeApiserver) -> None:
        super().__init__(ANSWERS)
        self.api = api
        self.seen: list[dict[str, tuple[str, str, str]]] = []
        self.artifacts: list[list[tuple[str, str]]] = []

    async def __call__(self, request: Any) -> Any:
        self.seen.append(conditions(self.api))
        listed = (self.api.status or {}).get("artifacts") or ()
        self.artifacts.append([(a["path"], a["state"]) for a in listed])
        return await super().__call__(request)


def test_a_pass_that_probes_says_so_before_its_probes_run(passes: list[str]) -> None:
    passes.extend(["ok", "ok"])
    api, wakeup = FakeApiserver(), Wakeup(passes=2)
    prober = WatchingProber(api)
    PROBER.set(prober)
    asyncio.run(run_bundle(api.body, runtime(api, wakeup), lambda: wakeup.left <= 0))

    # The first pass probes both artifacts: Reconciling (Probing) is stored before they run.
    assert len(prober.seen) == 2  # the second pass reuses the answers: no probe, no Probing
    for seen in prober.seen:
        assert seen["Reconciling"][:2] == ("True", "Probing")
        assert seen["Reconciling"][2].startswith("probing 2 artifacts of revision folder:")
        assert seen["Ready"][:2] == ("Unknown", "Probing")
    assert prober.artifacts[0] == [("extract.min.mjs", "Probing"), ("load.min.mjs", "Probing")]
    # The pass's own status replaces it: Ready, no Reconciling, the artifacts Probed.
    done = conditions(api)
    assert done["Ready"][:2] == ("True", "Succeeded") and "Reconciling" not in done
    assert {a["state"] for a in (api.status or {})["artifacts"]} == {"Cached"}
    assert len(api.patches) == 3  # Probing, Ready, then the second pass's cached answers


def test_an_artifact_waiting_out_its_probe_back_off_is_not_reported_as_probing(
    bundle: Path,
) -> None:
    from datetime import UTC, datetime

    from taskhandler_operator.artifacts.listing import list_candidates
    from taskhandler_operator.artifacts.models import Language
    from taskhandler_operator.controller.bundle import StatusProgress
    from taskhandler_operator.kube.status import TaskHandlerBundleStatus

    candidates = list_candidates(bundle, Language.TYPESCRIPT).candidates
    api = FakeApiserver()
    memory = BundleMemory()
    for c in candidates:  # every one failed for a reason outside it, a minute ago
        memory.probe_retries.failed(
            c.rel_path, c.cache_digest, "PodLost", "lost", time.monotonic(), datetime.now(UTC)
        )
    progress = StatusProgress(
        BundleInputs.from_body(api.body()),
        runtime(api, Wakeup(0)),
        memory,
        TaskHandlerBundleStatus(),
    )
    asyncio.run(progress.probing("folder:1", candidates))
    assert api.patches == [] and progress.written is None
    memory.probe_retries.settled(candidates[0].rel_path)
    asyncio.run(progress.probing("folder:1", candidates))
    assert [a["path"] for a in api.status["artifacts"]] == [candidates[0].rel_path]  # type: ignore[index]


def test_the_probing_status_does_not_claim_a_reconcile_request_handled(bundle: Path) -> None:
    # lastHandledReconcileAt tells a user waiting on a reconcile-now request that the pass is
    # done; the Probing write comes before the probes, so it must leave it as it was.
    from taskhandler_operator.artifacts.listing import list_candidates
    from taskhandler_operator.artifacts.models import Language
    from taskhandler_operator.controller.bundle import StatusProgress
    from taskhandler_operator.kube import names
    from taskhandler_operator.kube.status import TaskHandlerBundleStatus

    candidates = list_candidates(bundle, Language.TYPESCRIPT).candidates
    api = FakeApiserver()
    body = dict(api.body())
    meta = dict(body["metadata"])
    meta["annotations"] = {names.ANNOTATION_RECONCILE_REQUESTED_AT: "now-1"}
    body["metadata"] = meta
    inputs = BundleInputs.from_body(body)
    assert inputs.requested_at == "now-1"
    progress = StatusProgress(
        inputs, runtime(api, Wakeup(0)), BundleMemory(), TaskHandlerBundleStatus()
    )
    asyncio.run(progress.probing("folder:1", candidates))
    assert progress.written is not None
    assert progress.written.last_handled_reconcile_at is None
    assert "lastHandledReconcileAt" not in (api.status or {})
