"""The dashboard's series, computed from real prometheus_client metrics: the platform's own definitions
(inference/engine/contract/metrics.py) read back through collect_families(), as `serve` samples them. Each test
uses model names of its own, so the process-wide counters other tests move never reach its deltas."""

import pytest
from prometheus_client import CollectorRegistry, Counter

from inference.engine.contract import metrics
from inference.runtime.metric_series import histogram_quantile
from inference.runtime.metrics_history import MetricsHistory
from pantheon_site.metrics import collect_families

INTERVAL_S = 5.0


def history() -> MetricsHistory:
    return MetricsHistory(INTERVAL_S, collect_families)


def test_rates_come_from_counter_deltas_over_the_elapsed_time():
    kept = history()
    metrics.COMPLETION_TOKENS.labels(model="rates").inc(1000)  # before the first reading: never in a rate
    metrics.REFUSALS.labels(model="rates", reason="queue_full").inc(7)
    kept.record(collect_families(), now=1000.0)
    metrics.COMPLETION_TOKENS.labels(model="rates").inc(300)
    metrics.REFUSALS.labels(model="rates", reason="queue_full").inc(3)
    metrics.REFUSALS.labels(model="rates", reason="memory").inc(2)  # every reason counts
    kept.record(collect_families(), now=1000.0 + INTERVAL_S)
    metrics.COMPLETION_TOKENS.labels(model="rates").inc(40)
    kept.record(collect_families(), now=1000.0 + 3 * INTERVAL_S)  # a late sample: its own elapsed time

    series = kept.series(["rates"])
    assert series["t"] == [1000.0, 1005.0, 1015.0]
    assert series["models"]["rates"]["tokens_per_s"] == [None, 300 / 5, 40 / 10]
    assert series["models"]["rates"]["refusals_per_s"] == [None, 5 / 5, 0.0]


def test_ttft_quantiles_come_from_the_bucket_deltas_of_each_interval():
    kept = history()
    ttft = metrics.TIME_TO_FIRST_TOKEN.labels(model="ttft")
    for _ in range(50):
        ttft.observe(0.003)  # before the first reading: would pull p50 into the first bucket if counted
    kept.record(collect_families(), now=0.0)
    # buckets ... 0.25, 0.5, 1, 2.5, 5 ...: 4 in (0.25, 0.5], 4 in (0.5, 1], 2 in (2.5, 5]
    for value in [0.3] * 4 + [0.7] * 4 + [3.0] * 2:
        ttft.observe(value)
    kept.record(collect_families(), now=INTERVAL_S)
    kept.record(collect_families(), now=2 * INTERVAL_S)  # no first token in this interval
    for _ in range(10):
        ttft.observe(200.0)  # past the last finite bucket (120)
    kept.record(collect_families(), now=3 * INTERVAL_S)

    ttft_series = kept.series(["ttft"])["models"]["ttft"]
    # p50: rank 5 falls in (0.5, 1] holding ranks 5..8: 0.5 + 0.5 * (5 - 4) / 4
    # p99: rank 9.9 falls in (2.5, 5] holding ranks 9..10: 2.5 + 2.5 * (9.9 - 8) / 2
    assert ttft_series["ttft_p50_s"] == [None, 0.625, None, 120.0]
    assert ttft_series["ttft_p99_s"] == [None, pytest.approx(4.875, rel=1e-12), None, 120.0]


def test_gauges_are_the_values_at_each_sample_and_a_model_without_metrics_is_a_gap():
    kept = history()
    kept.record(collect_families(), now=0.0)
    metrics.QUEUE_DEPTH.labels(model="gauges").set(4)
    metrics.KV_BLOCKS_USED.labels(model="gauges").set(37)
    kept.record(collect_families(), now=INTERVAL_S)
    metrics.QUEUE_DEPTH.labels(model="gauges").set(0)
    kept.record(collect_families(), now=2 * INTERVAL_S)

    series = kept.series(["gauges", "never-seen"])["models"]
    assert series["gauges"]["queue_depth"] == [None, 4.0, 0.0]
    assert series["gauges"]["kv_blocks_used"] == [None, 37.0, 37.0]
    assert series["gauges"]["tokens_per_s"] == [None, 0.0, 0.0]  # no reading before the first: no rate
    assert all(values == [None, None, None] for values in series["never-seen"].values())


def test_a_model_first_seen_between_two_readings_counted_from_zero():
    """A model loaded and used within one interval: its counters did not exist at the reading before."""
    kept = history()
    kept.record(collect_families(), now=0.0)
    metrics.COMPLETION_TOKENS.labels(model="newcomer").inc(50)
    kept.record(collect_families(), now=INTERVAL_S)
    assert kept.series(["newcomer"])["models"]["newcomer"]["tokens_per_s"] == [None, 50 / INTERVAL_S]


def test_the_history_keeps_the_window_and_drops_older_points():
    kept = MetricsHistory(INTERVAL_S, collect_families, window_s=3 * INTERVAL_S)
    tokens = metrics.COMPLETION_TOKENS.labels(model="window")
    for step in range(10):
        tokens.inc(step)
        kept.record(collect_families(), now=step * INTERVAL_S)
    series = kept.series(["window"])
    assert series["t"] == [7 * INTERVAL_S, 8 * INTERVAL_S, 9 * INTERVAL_S]
    assert series["models"]["window"]["tokens_per_s"] == [7 / INTERVAL_S, 8 / INTERVAL_S, 9 / INTERVAL_S]


def test_a_counter_that_went_down_was_reset_and_counts_from_zero():
    """A process restarted with its counters at zero (a fresh registry stands in for it)."""
    kept = history()
    before, after = CollectorRegistry(), CollectorRegistry()
    Counter("pantheon_completion_tokens", "", ["model"], registry=before).labels(model="reset").inc(500)
    Counter("pantheon_completion_tokens", "", ["model"], registry=after).labels(model="reset").inc(20)
    kept.record(before.collect(), now=0.0)
    kept.record(after.collect(), now=INTERVAL_S)
    assert kept.series(["reset"])["models"]["reset"]["tokens_per_s"] == [None, 20 / INTERVAL_S]


def test_histogram_quantile_matches_prometheus_at_the_edges():
    inf = float("inf")
    assert histogram_quantile(0.5, [(1.0, 0.0), (inf, 0.0)]) is None  # no observation
    assert histogram_quantile(0.5, [(1.0, 4.0), (2.0, 4.0), (inf, 4.0)]) == 0.5  # the first bucket starts at 0
    assert histogram_quantile(0.99, [(1.0, 1.0), (2.0, 1.0), (inf, 100.0)]) == 2.0  # in +Inf: the last finite bound
