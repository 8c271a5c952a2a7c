"""What the dashboard's charts plot, computed from the Prometheus metrics the platform already exports.

A reading is each model's cumulative counters, TTFT histogram buckets and gauges at one instant (read from the
metric families `pantheon_site.metrics.collect_families()` returns, by sample name, so it works alike on a plain
registry and on the multi-process collector). A point is what happened between two readings: counter deltas over
the elapsed time (tokens and refusals per second) and TTFT quantiles from the bucket deltas, interpolated the way
Prometheus's `histogram_quantile` does, so a chart and a Grafana panel over the same interval agree. The names are
fixed in the metric table (docs/ui.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # prometheus_client decides at import whether values go to files: `serve` imports it first
    from prometheus_client import Metric

COMPLETION_TOKENS = "pantheon_completion_tokens_total"
REFUSALS = "pantheon_refusals_total"
TTFT_BUCKET = "pantheon_time_to_first_token_seconds_bucket"
QUEUE_DEPTH = "pantheon_queue_depth"
KV_BLOCKS_USED = "pantheon_kv_blocks_used"


@dataclass(slots=True)
class Reading:
    """One model's cumulative values at one instant, each summed over the labels other than `model` (the
    refusal reasons, the processes of a multi-process collector)."""

    completion_tokens: float = 0.0
    refusals: float = 0.0
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # upper bound `le` -> cumulative count
    queue_depth: float = 0.0
    kv_blocks_used: float = 0.0


@dataclass(frozen=True, slots=True)
class Point:
    """One model over one sampling interval. A rate is None without an earlier reading to compare with; a quantile
    is None when no first token came in the interval (a gap in the chart, not a zero)."""

    tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    queue_depth: float
    kv_blocks_used: float
    refusals_per_s: float | None


def read(families: Iterable[Metric]) -> dict[str, Reading]:
    """Every model's reading from the metric families (samples without a model, or with model "", are left out)."""
    readings: dict[str, Reading] = defaultdict(Reading)
    for family in families:
        for sample in family.samples:
            model = sample.labels.get("model", "")
            if not model:
                continue
            if sample.name == COMPLETION_TOKENS:
                readings[model].completion_tokens += sample.value
            elif sample.name == REFUSALS:
                readings[model].refusals += sample.value
            elif sample.name == TTFT_BUCKET:
                buckets = readings[model].ttft_buckets
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == QUEUE_DEPTH:
                readings[model].queue_depth += sample.value
            elif sample.name == KV_BLOCKS_USED:
                readings[model].kv_blocks_used += sample.value
    return dict(readings)


def point(previous: Reading | None, current: Reading, elapsed_s: float) -> Point:
    """What happened to one model between two readings `elapsed_s` apart (the gauges are the current values)."""
    if previous is None or elapsed_s <= 0:
        tokens = refusals = p50 = p99 = None
    else:
        tokens = _increase(previous.completion_tokens, current.completion_tokens) / elapsed_s
        refusals = _increase(previous.refusals, current.refusals) / elapsed_s
        buckets = sorted(
            (le, _increase(previous.ttft_buckets.get(le, 0.0), count)) for le, count in current.ttft_buckets.items()
        )
        p50, p99 = histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    return Point(tokens, p50, p99, current.queue_depth, current.kv_blocks_used, refusals)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The q-quantile of cumulative `buckets` [(upper bound, count)], ascending and ending with +Inf, as
    Prometheus's histogram_quantile estimates it: linear within the bucket the rank falls in (from 0 for the first
    bucket); the highest finite bound when the rank falls in +Inf. None without observations."""
    if len(buckets) < 2 or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    index = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    upper, count = buckets[index]
    if math.isinf(upper):
        return buckets[-2][0]
    lower, below = buckets[index - 1] if index > 0 else (0.0, 0.0)
    if index == 0 and upper <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)


def _increase(before: float, after: float) -> float:
    """A counter's increase; a counter that went down was reset (its process restarted), and counted from 0 since."""
    return after - before if after >= before else after
