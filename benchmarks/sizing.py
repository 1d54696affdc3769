"""The sizing table of docs/operations.md, derived from one ``benchmarks.operator`` run.

    .venv/bin/python -m benchmarks.sizing [benchmarks/results/operator.json]

Per shard of ``n`` bundles at interval ``T`` seconds:

- CPU (cores) = ``c0 + n / T * p``: ``p`` is the CPU of one unchanged pass and ``c0`` what a
  process costs with no pass, solved from the scale-out phase's one shard of ``N`` bundles and
  its two shards of ``N / 2`` (the same world, the same window length);
- peak RSS = ``m0 + n * m``, the line through the steady phase's two bundle counts at the
  same artifact count (1,000 x 20 and 100 x 20 at the defaults).

The rules that turn them into settings (why: docs/operations.md, "Bundles per shard"):
at most ``MAX_BUNDLES_PER_SHARD`` bundles and ``MAX_CORES_PER_SHARD`` of a core per shard; the
memory request is the peak rounded up to 64 MiB and never under the chart's default, the limit
twice that and never under the chart's; the CPU request is the formula rounded up to 50m and
never under the chart's 100m.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks._report import RESULTS_DIR
from taskhandler_devenv.chart_install import CHART
from taskhandler_operator.kube.duration import parse_duration
from taskhandler_operator.kube.markers import quantity_value

MAX_BUNDLES_PER_SHARD = 2000
MAX_CORES_PER_SHARD = 0.5


def _chart_resources() -> tuple[int, int, int]:
    """The chart's default operator resources: memory request and limit (MiB), CPU request (m)."""
    resources = yaml.safe_load((CHART / "values.yaml").read_text())["resources"]
    return (
        round(quantity_value(resources["requests"]["memory"]) / 2**20),
        round(quantity_value(resources["limits"]["memory"]) / 2**20),
        round(quantity_value(resources["requests"]["cpu"]) * 1000),
    )


CHART_MEMORY_REQUEST_MIB, CHART_MEMORY_LIMIT_MIB, CHART_CPU_REQUEST_M = _chart_resources()

# (bundles, interval in seconds) of the table's rows.
WORLDS: tuple[tuple[int, int], ...] = (
    (500, 300),
    (1000, 300),
    (2000, 300),
    (5000, 300),
    (10000, 300),
    (1000, 60),
    (2000, 60),
    (5000, 60),
    (10000, 60),
)


@dataclass(frozen=True)
class Model:
    """The slopes the table is computed with, and where they came from."""

    pass_cpu_seconds: float  # p
    base_cores: float  # c0
    base_mib: float  # m0
    mib_per_bundle: float  # m
    cpu_source: str

    def cores(self, bundles: int, interval_s: float) -> float:
        return self.base_cores + bundles / interval_s * self.pass_cpu_seconds

    def peak_mib(self, bundles: int) -> float:
        return self.base_mib + bundles * self.mib_per_bundle


def cpu_model(scaleout: Mapping[str, Any]) -> tuple[float, float, str]:
    """``(p, c0, how)`` from one shard of N against two of N/2.

    The single shard's CPU per second is the one the phase's target reads: the mean of its
    windows before and after the two shards (``one_shard_cpu_per_second``), when the run has
    both. Two windows of a noisy machine can give the halves more CPU than the whole's half; the
    solution then has no meaning (a negative ``p`` or ``c0``), and the single shard's CPU per
    pass is taken as ``p`` with ``c0`` = 0, which overstates nothing.
    """
    n = scaleout["bundles"]
    interval = parse_duration(scaleout["interval"]).total_seconds()
    one = scaleout["one_shard"]["shards"]["default"]
    halves = list(scaleout["two_shards"]["shards"].values())
    cpu_one = scaleout.get("one_shard_cpu_per_second") or one["cpu_per_second"]
    cpu_half = statistics.fmean(h["cpu_per_second"] for h in halves)
    p = 2 * interval * (cpu_one - cpu_half) / n
    c0 = cpu_half - n * p / (2 * interval)
    if p > 0 and c0 >= 0:
        return p, c0, "solved from one shard and two"
    return one["cpu_ms_per_pass"] / 1000, 0.0, "the single shard's CPU per pass, c0 = 0"


def memory_model(big: Mapping[str, Any], small: Mapping[str, Any]) -> tuple[float, float]:
    """``(m0, m)``: the line through two steady sets' peak RSS (same artifacts per bundle)."""
    if big["artifacts_per_bundle"] != small["artifacts_per_bundle"]:
        raise ValueError("the two steady sets differ in artifacts per bundle")
    m = (big["peak_rss_mib"] - small["peak_rss_mib"]) / (big["bundles"] - small["bundles"])
    return small["peak_rss_mib"] - small["bundles"] * m, m


def model(run: Mapping[str, Any]) -> Model:
    p, c0, how = cpu_model(run["scaleout"])
    m0, m = memory_model(run["steady"], run["steady_base"])
    return Model(p, c0, m0, m, how)


def shards_for(model: Model, bundles: int, interval_s: float) -> int:
    """The fewest shards that keep each under both per-shard limits."""
    shards = 1
    while True:
        per_shard = math.ceil(bundles / shards)
        if (
            per_shard <= MAX_BUNDLES_PER_SHARD
            and model.cores(per_shard, interval_s) <= MAX_CORES_PER_SHARD
        ) or per_shard == 1:
            return shards
        shards += 1


def _round_up(value: float, step: int) -> int:
    return math.ceil(value / step) * step


def rows(model: Model, worlds: Sequence[tuple[int, int]] = WORLDS) -> list[dict[str, Any]]:
    table = []
    for bundles, interval_s in worlds:
        shards = shards_for(model, bundles, interval_s)
        per_shard = math.ceil(bundles / shards)
        peak = model.peak_mib(per_shard)
        request = max(CHART_MEMORY_REQUEST_MIB, _round_up(peak, 64))
        cores = model.cores(per_shard, interval_s)
        table.append(
            {
                "bundles": bundles,
                "interval": f"{interval_s // 60} min",
                "shards": shards,
                "bundles per shard": per_shard,
                "peak RSS per shard": f"{peak:.0f} MiB",
                "memory request / limit": (
                    f"{request}Mi / {max(CHART_MEMORY_LIMIT_MIB, 2 * request)}Mi"
                ),
                "CPU per shard (cores)": f"{cores:.2f}",
                "CPU request": f"{max(CHART_CPU_REQUEST_M, _round_up(cores * 1000, 50))}m",
            }
        )
    return table


def markdown(table: Sequence[Mapping[str, Any]]) -> str:
    columns = list(table[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table:
        lines.append(
            "| "
            + " | ".join(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values())
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "result",
        nargs="?",
        type=Path,
        default=RESULTS_DIR / "operator.json",
        help="a benchmarks.operator result with its steady and scaleout phases",
    )
    args = parser.parse_args(argv)
    run = json.loads(args.result.read_text())
    missing = {"steady", "steady_base", "scaleout"} - run.keys()
    if missing:
        print(f"{args.result} has no {', '.join(sorted(missing))} phase", file=sys.stderr)
        return 2
    fitted = model(run)
    print(
        f"p = {fitted.pass_cpu_seconds * 1000:.2f} ms per pass, c0 = {fitted.base_cores:.3f} "
        f"cores ({fitted.cpu_source}); m0 = {fitted.base_mib:.0f} MiB, "
        f"m = {fitted.mib_per_bundle:.3f} MiB per bundle\n"
    )
    print(markdown(rows(fitted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
