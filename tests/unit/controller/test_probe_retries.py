"""JobProber's back-off of retryable failures: the decision around one probe, with the Job part
(``_probe``) replaced by scripted outcomes (a unit test of that logic only; the Jobs themselves
are exercised in tests/e2e/test_operator_faults.py)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from taskhandler_operator.artifacts.models import Candidate, Language
from taskhandler_operator.controller.backoff import Backoff, ProbeRetries
from taskhandler_operator.controller.probing import JobProber
from taskhandler_operator.kube.probe_job import BundleIdentity
from taskhandler_operator.kube.status import MAX_ITEM_MESSAGE_CHARS
from taskhandler_operator.reconcile.models import ProbeAccepted, ProbeFailed, ProbeRequest
from taskhandler_operator.sources.store import RevisionStore


class Scripted(JobProber):
    """Answers each probe with the next scripted outcome, counting the Jobs it would run."""

    def __init__(self, outcomes: Iterator[ProbeAccepted | ProbeFailed], retries: ProbeRetries):
        self.outcomes = outcomes
        self.calls = 0
        self.codes = {}
        self.retries = retries
        self.bundle = BundleIdentity("ns", "b", "uid", "b")
        self.artifacts = cast(Any, SimpleNamespace(store=RevisionStore(Path("/nonexistent"))))

    async def _probe(self, request: ProbeRequest) -> ProbeAccepted | ProbeFailed:
        self.calls += 1
        outcome = next(self.outcomes)
        if isinstance(outcome, ProbeFailed):
            self.codes[outcome.rel_path] = "FetchFailed" if outcome.retryable else "Crashed"
        return outcome


class Top(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def request(digest: str = "d1") -> ProbeRequest:
    return ProbeRequest("b", Language.GO, Path("/r"), Candidate("extract", 10, digest), "rev")


def retries() -> ProbeRetries:
    return ProbeRetries(Backoff(base=300, cap=600), Top())


async def test_a_retryable_failure_is_not_probed_again_until_its_back_off_ends() -> None:
    fetch = ProbeFailed("extract", "download refused", retryable=True)
    prober = Scripted(iter([fetch, fetch]), retries())
    first = await prober(request())
    assert isinstance(first, ProbeFailed) and first.retryable
    assert first.reason.startswith("download refused (attempt 1; next attempt after 20")
    # Passes woken meanwhile (the failed Job's own events) run no Job and say the same.
    for _ in range(3):
        again = await prober(request())
        assert again == first
    assert prober.calls == 1 and prober.codes["extract"] == "FetchFailed"
    # A new artifact content is probed at once.
    await prober(request("d2"))
    assert prober.calls == 2


async def test_an_answer_or_a_final_failure_clears_the_wait() -> None:
    crash = ProbeFailed("extract", "exit 2", retryable=False)
    accepted = ProbeAccepted("extract", cast(Any, None))
    shared = retries()
    prober = Scripted(iter([crash, accepted]), shared)
    assert await prober(request()) == crash  # final: its own message, no wait recorded
    assert len(shared) == 0
    assert await prober(request()) == accepted
    assert prober.calls == 2


async def test_a_long_message_keeps_when_the_next_attempt_is() -> None:
    fetch = ProbeFailed("extract", "x" * 2000, retryable=True)
    prober = Scripted(iter([fetch]), retries())
    out = await prober(request())
    assert isinstance(out, ProbeFailed)
    assert len(out.reason) <= MAX_ITEM_MESSAGE_CHARS
    assert out.reason.endswith("Z)") and "next attempt after" in out.reason
