"""kstatus conditions and the status model: transitions, summary, bounded lists, equality."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskhandler_operator.kube.conditions import (
    RETRIES,
    STALLS,
    Reason,
    Reasoned,
    find_condition,
    set_condition,
    stalls,
    status_unchanged,
    summarize,
)
from taskhandler_operator.kube.status import (
    MAX_ARTIFACTS,
    MAX_CONDITION_MESSAGE_CHARS,
    MAX_PROBLEMS,
    ArtifactState,
    ArtifactStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Counts,
    Problem,
    TaskHandlerBundleStatus,
    bounded,
    shorten,
    status_artifacts,
    status_problems,
)
from taskhandler_operator.sources import errors as source_errors

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
TRUE, FALSE, UNKNOWN = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def domain(
    source: ConditionStatus = TRUE,
    probed: ConditionStatus = TRUE,
    published: ConditionStatus = TRUE,
    now: datetime = T0,
) -> list[Condition]:
    out: list[Condition] = []
    for type_, status, reason in (
        (ConditionType.SOURCE_READY, source, "Synced" if source == TRUE else "SourceFailed"),
        (ConditionType.ARTIFACTS_PROBED, probed, "Probed" if probed == TRUE else "ProbeFailed"),
        (ConditionType.BINDINGS_PUBLISHED, published, "Published"),
    ):
        out = set_condition(out, type_, status, reason, f"{reason} msg", generation=3, now=now)
    return out


def by_type(conditions: list[Condition]) -> dict[str, Condition]:
    return {c.type: c for c in conditions}


def test_transition_time_changes_only_when_status_flips() -> None:
    first = set_condition([], "SourceReady", TRUE, "Synced", "rev a", generation=1, now=T0)
    same = set_condition(first, "SourceReady", TRUE, "Synced", "rev b", generation=2, now=T1)
    flipped = set_condition(same, "SourceReady", FALSE, "SourceFailed", "x", generation=2, now=T1)
    assert first[0].last_transition_time == T0.replace(microsecond=0)
    assert same[0].last_transition_time == T0.replace(microsecond=0)
    assert same[0].message == "rev b" and same[0].observed_generation == 2
    assert flipped[0].last_transition_time == T1.replace(microsecond=0)


def test_conditions_keep_a_fixed_order() -> None:
    conditions = set_condition([], "Custom", TRUE, "X", "", generation=1, now=T0)
    conditions = set_condition(conditions, "BindingsPublished", TRUE, "X", "", generation=1, now=T0)
    conditions = set_condition(conditions, "Ready", TRUE, "X", "", generation=1, now=T0)
    assert [c.type for c in conditions] == ["Ready", "BindingsPublished", "Custom"]


def test_all_domain_conditions_true_is_ready_without_abnormal_conditions() -> None:
    out = by_type(summarize(domain(), generation=3, now=T1, ready_message="5 bindings"))
    assert out["Ready"].status == TRUE and out["Ready"].reason == "Succeeded"
    assert out["Ready"].message == "5 bindings"
    assert "Reconciling" not in out and "Stalled" not in out


def test_a_false_domain_condition_makes_ready_false_and_retrying() -> None:
    out = by_type(summarize(domain(source=FALSE), generation=3, now=T1))
    assert (out["Ready"].status, out["Ready"].reason) == (FALSE, "SourceFailed")
    assert out["Ready"].message == "SourceFailed msg"
    assert (out["Reconciling"].status, out["Reconciling"].reason) == (
        TRUE,
        "ProgressingWithRetry",
    )


def test_progressing_is_ready_unknown_and_reconciling() -> None:
    why = Reasoned("Progressing", "new generation 4")
    out = by_type(summarize(domain(), generation=4, now=T1, progressing=why))
    assert (out["Ready"].status, out["Ready"].reason) == (UNKNOWN, "Progressing")
    assert out["Reconciling"].message == "new generation 4"
    assert out["Ready"].observed_generation == 4


def test_stalled_replaces_reconciling_and_fails_ready() -> None:
    busy = summarize(domain(), generation=3, now=T0, progressing=Reasoned("Progressing", "x"))
    why = Reasoned("QueueConflict", "queue go belongs to ns/other")
    out = by_type(summarize(busy, generation=3, now=T1, stalled=why))
    assert (out["Stalled"].status, out["Stalled"].reason) == (TRUE, "QueueConflict")
    assert (out["Ready"].status, out["Ready"].message) == (FALSE, "queue go belongs to ns/other")
    assert "Reconciling" not in out
    # Once the conflict is gone, Stalled is removed rather than set False (abnormal-true).
    healed = by_type(summarize(list(out.values()), generation=3, now=T1))
    assert "Stalled" not in healed and healed["Ready"].status == TRUE


def failing(reasons: dict[ConditionType, str]) -> list[Condition]:
    """The three domain conditions, False with the given reasons, True otherwise."""
    out = domain()
    for type_, reason in reasons.items():
        out = set_condition(out, type_, FALSE, reason, f"{reason} msg", generation=3, now=T0)
    return out


@pytest.mark.parametrize(
    "reason",
    ["StubsUnbound", "ArtifactsFailed", "DatabaseError", "ChecksumMismatch", "InvalidSource"],
)
def test_a_failure_only_a_person_can_fix_is_stalled_not_retrying(reason: str) -> None:
    type_ = {
        "StubsUnbound": ConditionType.BINDINGS_PUBLISHED,
        "ArtifactsFailed": ConditionType.ARTIFACTS_PROBED,
        "DatabaseError": ConditionType.BINDINGS_PUBLISHED,
    }.get(reason, ConditionType.SOURCE_READY)
    out = by_type(summarize(failing({type_: reason}), generation=3, now=T1))
    assert (out["Stalled"].status, out["Stalled"].reason) == (TRUE, reason)
    assert out["Stalled"].message == f"{reason} msg"
    assert (out["Ready"].status, out["Ready"].reason) == (FALSE, reason)
    assert "Reconciling" not in out


@pytest.mark.parametrize(
    "reason", ["SourceTimeout", "DatabaseUnavailable", "ProbesRetrying", "SecretNotFound"]
)
def test_a_failure_that_may_go_away_retries_and_is_not_stalled(reason: str) -> None:
    stalled_before = summarize(
        failing({ConditionType.BINDINGS_PUBLISHED: "StubsUnbound"}), generation=3, now=T0
    )
    type_ = ConditionType.ARTIFACTS_PROBED if reason == "ProbesRetrying" else None
    conditions = set_condition(
        stalled_before,
        type_ or ConditionType.SOURCE_READY,
        FALSE,
        reason,
        f"{reason} msg",
        generation=3,
        now=T1,
    )
    # A retrying failure beside a stalling one: the retry may change the picture.
    out = by_type(summarize(conditions, generation=3, now=T1))
    assert (out["Reconciling"].status, out["Reconciling"].reason) == (
        TRUE,
        "ProgressingWithRetry",
    )
    assert out["Reconciling"].message == f"{reason} msg"
    assert "Stalled" not in out
    assert out["Ready"].status == FALSE


def test_probing_is_reconciling_even_over_a_stall_and_the_stall_returns_after() -> None:
    stalled = summarize(
        failing({ConditionType.BINDINGS_PUBLISHED: "StubsUnbound"}), generation=3, now=T0
    )
    why = Reasoned("Probing", "probing 1 artifact of revision r2 in Jobs (a)")
    out = by_type(summarize(stalled, generation=3, now=T1, progressing=why))
    assert (out["Reconciling"].status, out["Reconciling"].reason) == (TRUE, "Probing")
    assert "Stalled" not in out
    # The last pass's failure still describes the bindings in the database meanwhile.
    assert (out["Ready"].status, out["Ready"].reason) == (FALSE, "StubsUnbound")
    again = by_type(summarize(list(out.values()), generation=3, now=T1))
    assert again["Stalled"].reason == "StubsUnbound" and "Reconciling" not in again


def test_a_failed_pass_is_ready_false_and_retrying_whatever_the_domain_says() -> None:
    why = Reasoned("InternalError", "RuntimeError: boom")
    out = by_type(summarize(domain(), generation=3, now=T1, failed=why))
    assert (out["Ready"].status, out["Ready"].reason) == (FALSE, "InternalError")
    assert out["Ready"].message == "RuntimeError: boom"
    assert (out["Reconciling"].reason, out["Reconciling"].message) == (
        "ProgressingWithRetry",
        "RuntimeError: boom",
    )
    assert "Stalled" not in out
    # The domain conditions keep what the last pass observed.
    assert out["BindingsPublished"].status == TRUE


def test_every_false_reason_either_stalls_or_retries() -> None:
    # A reason that can be False on a domain condition, or be Stalled, must be decided here
    # (docs/operator.md's table shows the verdict); the Ready/Reconciling reasons and the
    # True ones are not failures.
    not_failures = {
        Reason.SUCCEEDED,
        Reason.PROGRESSING,
        Reason.PROGRESSING_WITH_RETRY,
        Reason.PROBING,
        Reason.SYNCED,
        Reason.PROBED,
        Reason.PUBLISHED,
    }
    for reason in Reason:
        if reason in not_failures:
            continue
        assert (reason in STALLS) != (reason in RETRIES), reason
        assert stalls(reason) == (reason in STALLS)
    assert not STALLS & RETRIES


def test_the_sources_reasons_stall_exactly_when_their_error_is_permanent() -> None:
    for name in source_errors.__all__:
        cls = getattr(source_errors, name)
        if isinstance(cls, type) and issubclass(cls, source_errors.SourceError):
            assert stalls(cls.reason) == cls.permanent, cls.reason
    assert not stalls("SomeNewReason")  # undecided: InProgress, the safe answer


def test_missing_domain_conditions_leave_ready_unknown_naming_them() -> None:
    only_source = domain()[:1]
    out = by_type(summarize(only_source, generation=1, now=T0))
    assert out["Ready"].status == UNKNOWN
    assert out["Ready"].message == "waiting for ArtifactsProbed, BindingsPublished"


def test_same_observation_gives_an_unchanged_status() -> None:
    def status(previous: list[Condition], now: datetime) -> TaskHandlerBundleStatus:
        # One pass: set the domain conditions from what was observed, then summarize.
        conditions = list(previous)
        for c in domain(now=now):
            conditions = set_condition(
                conditions, c.type, c.status, c.reason, c.message, generation=3, now=now
            )
        return TaskHandlerBundleStatus(
            observed_generation=3,
            conditions=summarize(conditions, generation=3, now=now),
            revision="main@sha1:abc",
            counts=Counts(handlers=5, bindings=5),
        )

    first = status([], T0)
    again = status(first.conditions, T1)  # a later pass seeing the same thing
    assert status_unchanged(first.to_body(), again)
    assert status_unchanged(first, again)
    changed = again.model_copy(update={"revision": "main@sha1:def"})
    assert not status_unchanged(first.to_body(), changed)
    assert not status_unchanged(None, again)
    assert not status_unchanged({"conditions": "garbage"}, again)


def test_status_body_is_camel_case_with_rfc3339_seconds() -> None:
    status = TaskHandlerBundleStatus(
        conditions=domain()[:1],
        counts=Counts(unbound_stubs=2),
        last_handled_reconcile_at="2026-01-01T00:00:00Z",
    )
    body = status.to_body()
    assert body["counts"]["unboundStubs"] == 2
    assert body["lastHandledReconcileAt"] == "2026-01-01T00:00:00Z"
    assert body["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert "revision" not in body  # None is left out, not written as null
    assert TaskHandlerBundleStatus.model_validate(body) == status


def test_long_texts_are_cut_to_fit() -> None:
    cond = Condition(
        type="Ready", status=FALSE, reason="X", message="m" * 5000, last_transition_time=T0
    )
    assert len(cond.message) == MAX_CONDITION_MESSAGE_CHARS and cond.message.endswith("…")
    art = ArtifactStatus(path="d/" * 1000 + "etl", state=ArtifactState.FAILED, message="e" * 900)
    assert art.path.endswith("/etl") and art.path.startswith("…")
    assert shorten("abc", 10) == "abc"


def test_lists_are_bounded_with_failures_and_errors_first() -> None:
    healthy = [ArtifactStatus(path=f"a{i:03}", state=ArtifactState.CACHED) for i in range(80)]
    broken = ArtifactStatus(path="zzz", state=ArtifactState.FAILED, reason="OutOfMemory")
    shown, omitted = status_artifacts([*healthy, broken])
    assert len(shown) == MAX_ARTIFACTS and omitted == 81 - MAX_ARTIFACTS
    assert shown[0] is broken

    warnings = [Problem(severity="warning", kind="arguments", message=f"w{i}") for i in range(30)]
    error = Problem(severity="error", kind="unbound", dag_id="d", task_id="t", message="unbound")
    problems, more = status_problems([*warnings, error])
    assert problems[0] is error and len(problems) == MAX_PROBLEMS and more == 11
    assert bounded([1, 2], 5) == ([1, 2], 0)
    status = TaskHandlerBundleStatus(
        artifacts=shown, artifacts_omitted=omitted, problems=problems, problems_omitted=more
    )
    assert status.to_body()["artifactsOmitted"] == 31


def test_find_condition() -> None:
    assert find_condition(domain(), "SourceReady") is not None
    assert find_condition(domain(), "Ready") is None
