"""Artifact readers (Go, Java, TypeScript), bundle listing and the fast-path planner (pure).

The public API other programs import is :data:`__all__`; each name is loaded from its module on
first use, so importing the package (the CLI does, to list its commands) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskhandler_operator.artifacts.listing import (
        ListingCache,
        ListingProblem,
        ListingResult,
        ListingStats,
        list_candidates,
    )
    from taskhandler_operator.artifacts.models import (
        ArtifactVerificationError,
        Candidate,
        Language,
        VerifiedArtifact,
    )
    from taskhandler_operator.artifacts.planner import KnownArtifact, ProbePlan, plan_probes
    from taskhandler_operator.artifacts.verify import guess_language, verify_artifact

__all__ = [
    "ArtifactVerificationError",
    "Candidate",
    "KnownArtifact",
    "Language",
    "ListingCache",
    "ListingProblem",
    "ListingResult",
    "ListingStats",
    "ProbePlan",
    "VerifiedArtifact",
    "guess_language",
    "list_candidates",
    "plan_probes",
    "verify_artifact",
]

_HOMES = {
    "listing": (
        "ListingCache",
        "ListingProblem",
        "ListingResult",
        "ListingStats",
        "list_candidates",
    ),
    "models": ("ArtifactVerificationError", "Candidate", "Language", "VerifiedArtifact"),
    "planner": ("KnownArtifact", "ProbePlan", "plan_probes"),
    "verify": ("guess_language", "verify_artifact"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
