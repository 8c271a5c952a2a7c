"""What `GET /metrics` shows: every metric family of this run, merged over its processes.

The definitions live in inference/engine/contract/metrics.py (the workers record there too). Under `serve` every
process writes to PROMETHEUS_MULTIPROC_DIR and `collect_families` reads all of their files, so the control plane's
counters and each worker's gauges appear in one scrape; without that folder (in-process tests) it is this process's
own registry. The UI's charts read the same families, so they and a Prometheus server never disagree.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from inference.engine.contract import metrics as definitions

# The text format every Prometheus server reads (2.x and 3.x); our names need none of 1.0.0's escaping.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def _registry() -> CollectorRegistry:
    folder = definitions.multiprocess_dir()
    if folder is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=folder)
    return registry


def collect_families() -> list[Metric]:
    """Every metric family (pantheon_* and, in a single process, prometheus_client's process metrics), with its
    samples, as /metrics renders them."""
    return list(_registry().collect())


def render() -> bytes:
    """The Prometheus text format of `collect_families()`."""
    return generate_latest(_registry())
