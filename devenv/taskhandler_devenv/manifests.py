"""TaskHandlerBundle manifests as the tests, the demo's helpers and the benchmarks apply them
(development only): one builder, so each caller names only its source and what it changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from taskhandler_operator.kube import names


def bundle_manifest(
    namespace: str,
    name: str,
    *,
    language: str,
    source: Mapping[str, Any],
    queues: Sequence[str] | None = None,
    bundle_name: str | None = None,
    interval: str = "1h",
    probe: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A TaskHandlerBundle over ``source``: ``bundleName`` defaults to ``name``, ``queues`` to
    ``[language]``, ``probe`` to a one-minute timeout; ``spec`` adds further fields (e.g.
    ``timeout``, ``deletionPolicy``)."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "bundleName": bundle_name or name,
            "language": language,
            "queues": list(queues or [language]),
            "source": dict(source),
            "interval": interval,
            "probe": dict(probe or {"timeout": "1m"}),
            **spec,
        },
    }
