"""The take-over decision of :class:`ClaimGuard`, the database calls replaced (the real ones
run in tests/integration/db/test_claims.py, the whole path in
tests/e2e/test_operator_ownership.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from taskhandler_operator.artifacts.models import Language
from taskhandler_operator.controller import ownership
from taskhandler_operator.controller.kubeapi import ApiRefused, NotFound
from taskhandler_operator.controller.ownership import ClaimGuard
from taskhandler_operator.db.claims import BundleClaimed
from taskhandler_operator.reconcile.models import BundleSpec
from taskhandler_operator.records import BundleOwner

T0 = datetime(2026, 3, 1, tzinfo=UTC)
ME = BundleOwner(cluster_id="c1", namespace="team-b", name="third", uid="uid-me")
HOLDER = BundleOwner(cluster_id="c1", namespace="team-a", name="first", uid="uid-old")
SPEC = BundleSpec(bundle_name="first", language=Language.GO, queues=("go",), owner=ME)
REF = {"apiVersion": "langsdk.dev/v1alpha1", "kind": "TaskHandlerBundle", "namespace": "team-b",
       "name": "third", "uid": "uid-me"}  # fmt: skip


class FakeKube:
    def __init__(self, found: dict[str, Any] | Exception) -> None:
        self.found = found
        self.events: list[tuple[dict[str, str], str, str, str]] = []

    async def get_bundle(self, namespace: str, name: str) -> dict[str, Any]:
        if isinstance(self.found, Exception):
            raise self.found
        return self.found

    async def post_event(self, regarding: dict[str, str], *, reason: str, note: str, type: str):  # type: ignore[no-untyped-def]
        self.events.append((regarding, reason, type, note))


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The claim held by ``holder`` until released."""
    state: dict[str, Any] = {"holder": HOLDER, "released": []}

    async def check(engine: Any, name: str, owner: BundleOwner, queues: Any) -> None:
        holder = state["holder"]
        if holder is not None and not holder.same_resource(owner):
            raise BundleClaimed(name, holder, T0)

    async def release(engine: Any, name: str, holder: BundleOwner) -> bool:
        state["released"].append((name, holder))
        state["holder"] = None
        return True

    monkeypatch.setattr(ownership, "check_claim", check)
    monkeypatch.setattr(ownership, "release_stale_claim", release)
    return state


async def test_a_gone_holder_is_taken_over_with_events_on_both_sides(
    database: dict[str, Any],
) -> None:
    kube = FakeKube(NotFound("read TaskHandlerBundle team-a/first: 404"))
    await ClaimGuard(kube, None, "c1", REF)(SPEC)  # type: ignore[arg-type]
    assert database["released"] == [("first", HOLDER)]
    [(mine, reason, kind, note), (old, _, old_kind, old_note)] = kube.events
    assert (mine, reason, kind) == (REF, "ClaimTakenOver", "Normal")
    assert "from TaskHandlerBundle team-a/first in cluster 'c1' (uid uid-old)" in note
    assert (old["namespace"], old["name"], old["uid"], old_kind) == (
        "team-a",
        "first",
        "uid-old",
        "Warning",
    )
    assert "taken over by team-b/third" in old_note


async def test_a_recreated_object_under_the_old_name_gets_the_event(
    database: dict[str, Any],
) -> None:
    kube = FakeKube({"metadata": {"name": "first", "namespace": "team-a", "uid": "uid-new"}})
    await ClaimGuard(kube, None, "c1", REF)(SPEC)  # type: ignore[arg-type]
    assert database["released"] == [("first", HOLDER)]
    assert kube.events[1][0]["uid"] == "uid-new"


@pytest.mark.parametrize(
    ("found", "cluster"),
    [
        ({"metadata": {"uid": "uid-old"}}, "c1"),  # alive: a real conflict
        (ApiRefused("forbidden"), "c1"),  # cannot tell: leave it
        (NotFound("gone"), "c2"),  # another cluster's holder: only a person can tell
    ],
)
async def test_a_holder_that_may_be_alive_stays_a_conflict(
    database: dict[str, Any], found: dict[str, Any] | Exception, cluster: str
) -> None:
    kube = FakeKube(found)
    with pytest.raises(BundleClaimed):
        await ClaimGuard(kube, None, cluster, REF)(SPEC)  # type: ignore[arg-type]
    assert database["released"] == [] and kube.events == []
