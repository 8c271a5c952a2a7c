"""Every Prometheus metric Pantheon exports, defined once (names and labels: docs/metrics.md).

Why here: both processes of a `serve` run record metrics. The control plane records what it alone sees (HTTP
requests, refusals at admission, loads and unloads, worker restarts); each worker records what only it knows at the
moment it changes (its models' queues, decoding sequences, KV blocks, resident sessions, token counts and timings,
the weights barrier). The engine may not import Django or anything above it, so the one home both sides import is
the torch-free, Django-free contract. Each metric still has one write point (named in its docs line below and in
docs/metrics.md).

Multi-process: `serve` sets PROMETHEUS_MULTIPROC_DIR (pantheon_site/metrics_dir.py) before anything imports
prometheus_client, so every process writes its values to files there and `/metrics` merges them
(pantheon_site/metrics.py). The workers' gauges are `livesum`: a dead worker's files are marked dead by the
supervisor (`forget_process`), so its gauges vanish while its counters and histograms keep counting. Without that
folder (an in-process test, the engine's command line) prometheus_client keeps plain in-memory values.
"""

from __future__ import annotations

import os

from prometheus_client import Counter, Gauge, Histogram

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Latency buckets (seconds): a first token from a millisecond (a cached prompt on a small model) to minutes (a long
# prompt queued on a busy CPU); a gap between tokens from sub-millisecond to a stalled second.
_FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# -- recorded by the control plane ---------------------------------------------------------------------------------

# pantheon_site/request_metrics.py (the middleware every route runs through; a stream when its last byte is sent)
REQUESTS = Counter(
    "pantheon_requests", "HTTP requests finished, by route, model and status", ["route", "model", "status"]
)
REQUEST_DURATION = Histogram(
    "pantheon_request_duration_seconds",
    "End-to-end latency of an HTTP request (to its last byte)",
    ["route", "model"],
    buckets=_REQUEST_BUCKETS,
)
# inference/api/generation_route.py (a generation the engine refused at admission, by the engine's reason)
REFUSALS = Counter("pantheon_refusals", "Generations refused, by reason", ["model", "reason"])
# inference/services/model_lifecycle.py (do_load_model / do_unload_model: the worker's LOAD / UNLOAD call)
MODEL_LOAD = Histogram("pantheon_model_load_seconds", "Model load duration", ["model"], buckets=_LOAD_BUCKETS)
MODEL_UNLOAD = Histogram("pantheon_model_unload_seconds", "Model unload duration", ["model"], buckets=_LOAD_BUCKETS)
# inference/runtime/supervisor.py (a dead worker restarted)
WORKER_RESTARTS = Counter("pantheon_worker_restarts", "Worker processes restarted after they died", ["device"])

# -- recorded by the workers (inference/engine/serving_metrics.py, the barrier in inference/engine/weights/) --------

TIME_TO_FIRST_TOKEN = Histogram(
    "pantheon_time_to_first_token_seconds",
    "Generation: from the request's arrival at its model to its first token",
    ["model"],
    buckets=_FIRST_TOKEN_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "pantheon_inter_token_latency_seconds",
    "Generation: the gap between consecutive tokens of a sequence",
    ["model"],
    buckets=_TOKEN_GAP_BUCKETS,
)
PROMPT_TOKENS = Counter("pantheon_prompt_tokens", "Prompt tokens of finished generations", ["model"])
CACHED_PROMPT_TOKENS = Counter(
    "pantheon_cached_prompt_tokens", "Prompt tokens served from the prefix cache or a session", ["model"]
)
COMPLETION_TOKENS = Counter("pantheon_completion_tokens", "Generated tokens of finished generations", ["model"])
QUEUE_DEPTH = Gauge("pantheon_queue_depth", "Requests waiting for a slot", ["model"], multiprocess_mode="livesum")
QUEUE_WAIT = Histogram(
    "pantheon_queue_wait_seconds", "Time a request waited for a slot", ["model"], buckets=_FIRST_TOKEN_BUCKETS
)
SEQUENCES_DECODING = Gauge(
    "pantheon_sequences_decoding", "Sequences in the batch", ["model"], multiprocess_mode="livesum"
)
KV_BLOCKS_USED = Gauge("pantheon_kv_blocks_used", "KV blocks in use", ["model"], multiprocess_mode="livesum")
KV_BLOCKS_FREE = Gauge(
    "pantheon_kv_blocks_free", "KV blocks free (cached prefixes included)", ["model"], multiprocess_mode="livesum"
)
SESSIONS_RESIDENT = Gauge(
    "pantheon_sessions_resident", "Session ids holding KV", ["model"], multiprocess_mode="livesum"
)
WEIGHTS_STATE = Gauge(
    "pantheon_weights_state",
    "1 for the model's current weights state, 0 for the others",
    ["model", "state"],
    multiprocess_mode="livesum",
)
WEIGHTS_COMMITS = Counter("pantheon_weights_commits", "Weights commits ended clean", ["model"])
WEIGHTS_BARRIER_HOLD = Histogram(
    "pantheon_weights_barrier_hold_seconds", "How long the barrier held a model (quiesce -> resume)", ["model"],
    buckets=_HOLD_BUCKETS,
)  # fmt: skip


def multiprocess_dir() -> str | None:
    """The folder the processes of this run write their metrics to, or None (plain in-memory values)."""
    return os.environ.get(MULTIPROC_ENV) or None


def forget_process(pid: int) -> None:
    """A dead process's live gauges no longer count (its counters and histograms do). Called by the supervisor for
    a worker that exited."""
    if multiprocess_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
