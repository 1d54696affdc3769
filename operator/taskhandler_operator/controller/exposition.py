"""``/metrics`` written in pieces, so a scrape never holds the whole page in memory.

prometheus-client builds a scrape's whole text before answering: at 1,000 bundles that is
about 5 MB of text, and the list of lines, the joined string and its bytes together raised the
operator's peak RSS by some 20 MiB on every scrape (measured). Here each metric family is
encoded by prometheus-client's own encoder (the one its ``Accept`` negotiation picks) a slice of
samples at a time, and the slices are stitched back into exactly the page the encoder would have
written whole: a family's header once, its sample lines in order, then the sections the text
format moves to the end of a family (``_created``, kept until the family ends; a line each per
series), and OpenMetrics' ``# EOF`` once, last. tests/unit/controller/test_exposition.py checks
the stitched page against the whole one, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["SAMPLES_PER_SLICE", "encode_in_slices"]

#: Samples encoded at once: about 100 KiB of text.
SAMPLES_PER_SLICE = 1000


class _Families(Collector):
    """Metric families as a collector (what an encoder takes)."""

    def __init__(self, *metrics: Metric) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def _slice(family: Metric, samples: list[Sample]) -> Metric:
    part = Metric(family.name, family.documentation, family.type, family.unit)
    part.samples = samples
    return part


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """The text's ``# HELP`` sections: (header lines, sample lines) each; text before the
    first header, if any, has an empty header."""
    sections: list[tuple[str, list[str]]] = []
    header: list[str] = []
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP ") and (header or lines):
            sections.append(("".join(header), lines))
            header, lines = [], []
        if line.startswith("# ") and not lines:
            header.append(line)
        else:
            lines.append(line)
    if header or lines:
        sections.append(("".join(header), lines))
    return sections


def encode_in_slices(
    registry: Collector, accept: str, per_slice: int = SAMPLES_PER_SLICE
) -> tuple[str, Iterator[bytes]]:
    """The content type the ``Accept`` header negotiates, and the page's pieces in order."""
    encoder, content_type = choose_encoder(accept)
    return content_type, _pieces(registry, encoder, per_slice)


def _pieces(
    registry: Collector, encoder: Callable[[Collector], bytes], per_slice: int
) -> Iterator[bytes]:
    # What the encoder ends every page with (OpenMetrics' "# EOF"; nothing in the text format).
    tail = encoder(_Families()).decode()
    for family in registry.collect():
        samples = list(family.samples)
        later: dict[str, list[str]] = {}  # sections the encoder puts after the family's lines
        first = True
        for start in range(0, max(len(samples), 1), per_slice):
            part = _slice(family, samples[start : start + per_slice])
            text = encoder(_Families(part)).decode()
            if tail and text.endswith(tail):
                text = text[: -len(tail)]
            sections = _sections(text)
            if not sections:
                continue
            (header, lines), rest = sections[0], sections[1:]
            yield ((header if first else "") + "".join(lines)).encode()
            first = False
            for extra_header, extra_lines in rest:
                later.setdefault(extra_header, []).extend(extra_lines)
        for extra_header, extra_lines in later.items():
            yield (extra_header + "".join(extra_lines)).encode()
    if tail:
        yield tail.encode()
