"""/metrics in slices (controller/exposition.py): the stitched page is the page
prometheus-client would have written whole, for each format its ``Accept`` negotiation gives."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client.exposition import choose_encoder

from taskhandler_operator.controller.exposition import encode_in_slices
from taskhandler_operator.controller.metrics import Metrics

ACCEPTS = (
    "",  # no header: the text format 0.0.4
    "text/plain; version=0.0.4",
    "text/plain; version=1.0.0; escaping=underscores",
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text",
)


def populated() -> CollectorRegistry:
    metrics = Metrics(shard="default")
    for i in range(7):
        name = f"bundle-{i}"
        metrics.observe_reconcile("ns", name, "success", 0.5 * i)
        metrics.observe_reconcile("ns", name, "unchanged", 0.01)
        metrics.count_probe("ns", name, "success")
        metrics.set_ready("ns", name, i % 2 == 0)
        metrics.set_bindings("ns", name, i)
        metrics.count_publication("ns", name, "published")
    registry = metrics.registry
    # Kinds the operator's own metrics do not use, and a family with no series yet.
    Summary("thop_test_summary", "a summary", ["k"], registry=registry).labels("a").observe(1)
    Info("thop_test_build", "an info", registry=registry).info({"version": '1\n"2"'})
    Gauge("thop_test_empty", "no series", ["k"], registry=registry)
    Counter("thop_test_plain", "no labels", registry=registry).inc()
    Histogram("thop_test_seconds", "a histogram", registry=registry).observe(2)
    return registry


@pytest.mark.parametrize("accept", ACCEPTS)
@pytest.mark.parametrize("per_slice", [1, 2, 3, 5, 1000])
def test_the_stitched_page_is_the_whole_page(accept: str, per_slice: int) -> None:
    registry = populated()
    encoder, whole_type = choose_encoder(accept)
    content_type, pieces = encode_in_slices(registry, accept, per_slice=per_slice)
    stitched = b"".join(pieces)
    assert content_type == whole_type
    assert stitched == encoder(registry)


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
def test_an_empty_registry_gives_the_empty_page(accept: str) -> None:
    encoder, _ = choose_encoder(accept)
    _, pieces = encode_in_slices(CollectorRegistry(), accept)
    assert b"".join(pieces) == encoder(CollectorRegistry())


def test_no_piece_holds_much_more_than_a_slice() -> None:
    metrics = Metrics(shard="default")
    for i in range(300):
        metrics.observe_reconcile("ns", f"bundle-{i:04d}", "success", 1.0)
    _, pieces = encode_in_slices(metrics.registry, "", per_slice=100)
    sizes = [len(piece) for piece in pieces]
    whole = sum(sizes)
    # 300 histograms of ~17 lines each, 100 samples a piece: many pieces, none near the page
    # (the largest is the _created section, one short line a series, written at the end).
    assert len(sizes) > 40 and max(sizes) < whole / 10
