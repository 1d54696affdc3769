"""The pass key: a digest of everything an unchanged pass's outcome depends on.

The unchanged pass (:mod:`taskhandler_operator.reconcile.steps`) compares a pass's inputs with
the last kept ones in memory, so a new process (a restart, a failover, an upgrade) starts with
nothing to compare and every bundle's first pass took the whole path: at a thousand bundles,
minutes of stale statuses. The key lets the stored status stand in for that memory: a pass that
keeps its outcome writes the key of its inputs into ``status.passKey``, and a first pass whose
inputs give the same key keeps the stored status instead of loading, validating and writing.

What goes in is what the in-memory comparison compares, by content instead of identity: the
spec the pass was given (without the writer's identity, which changes with every leader term),
the revision and its listing, the bundle's own Dags with their stub inventory (validation reads
no other since it was narrowed to them), and the watermark of the rows the pass reads and
writes. :data:`KEY_VERSION` changes whenever what a pass derives from the same inputs changes
(a new validation rule, a new row), so an upgrade that does takes the whole path once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from taskhandler_operator.airflow.serialized import DagStubs
from taskhandler_operator.artifacts.listing import ListingProblem
from taskhandler_operator.artifacts.models import Candidate
from taskhandler_operator.reconcile.models import BundleSpec

__all__ = ["KEY_VERSION", "pass_key"]

#: Bump when the same inputs would give another outcome (the key's contents or the pass's rules).
KEY_VERSION = "k1"


def pass_key(
    spec: BundleSpec,
    revision: str,
    candidates: Sequence[Candidate],
    problems: Sequence[ListingProblem],
    dags: Mapping[str, DagStubs],
    dag_ids: Sequence[str],
    rows: Sequence[int],
) -> str:
    """``k1:<sha256 hex>`` of the inputs; equal keys mean a pass would find nothing new."""
    publish = spec.publish.model_dump(mode="json", exclude={"operator"})
    parts: dict[str, Any] = {
        "spec": {
            "bundle_name": spec.bundle_name,
            "language": str(spec.language),
            "queues": list(spec.queues),
            "owner": spec.owner.model_dump(mode="json"),
            "publish": publish,
        },
        "revision": revision,
        "candidates": [[c.rel_path, c.size_bytes, c.cache_digest, c.error] for c in candidates],
        "problems": [[p.rel_path, p.message] for p in problems],
        # A Dag named but not in the inventory any more is recorded as absent (None).
        "dags": [
            [dag_id, None if dag_id not in dags else dags[dag_id].to_json()] for dag_id in dag_ids
        ],
        "rows": list(rows),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"{KEY_VERSION}:{hashlib.sha256(text.encode()).hexdigest()}"
