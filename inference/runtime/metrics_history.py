"""The last 15 minutes of the dashboard's charts, kept in the memory of `serve`.

Every PANTHEON_METRICS_HISTORY_INTERVAL_S the control plane reads the metrics (`collect_families()`, the same
families GET /metrics renders, every process's) and keeps one point per model (inference/runtime/metric_series.py)
in a ring that holds 15 minutes: its size is fixed at start, so memory stays bounded however long the server runs.
The UI reads `series()` through the services. A restart starts an empty history (Prometheus keeps the long one).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import TYPE_CHECKING

from inference.runtime import metric_series
from inference.runtime.metric_series import Point, Reading

if TYPE_CHECKING:  # prometheus_client decides at import whether values go to files: `serve` imports it first
    from prometheus_client import Metric

logger = logging.getLogger("pantheon.serve")

WINDOW_S = 15 * 60
SERIES = tuple(f.name for f in fields(Point))  # each model's series in the JSON, in Point's order


class MetricsHistory:
    def __init__(self, interval_s: float, collect: Callable[[], list[Metric]], window_s: float = WINDOW_S):
        self.interval_s = interval_s
        self.window_s = window_s
        self.collect = collect
        self._points: deque[tuple[float, dict[str, Point]]] = deque(maxlen=max(1, math.ceil(window_s / interval_s)))
        self._last: tuple[float, dict[str, Reading]] | None = None

    def record(self, families: Iterable[Metric], now: float) -> None:
        """Adds the point of every model in `families`, read at wall time `now`, against the previous reading. A
        model missing from that reading had no counter yet: they start at 0 (the run's metrics folder starts empty
        when the history does), so its first tokens count in the interval they came in."""
        readings = metric_series.read(families)
        last, self._last = self._last, (now, readings)
        points = {}
        for model, reading in readings.items():
            previous = last[1].get(model, Reading()) if last else None
            points[model] = metric_series.point(previous, reading, now - last[0] if last else 0.0)
        self._points.append((now, points))

    def series(self, models: Iterable[str]) -> dict:
        """The kept points of `models` as the dashboard's JSON: the sample times (unix seconds) and, per model, one
        list per series aligned with them (null where the model had no point)."""
        times = [t for t, _ in self._points]
        return {
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "t": times,
            "models": {
                model: {
                    name: [getattr(points[model], name) if model in points else None for _, points in self._points]
                    for name in SERIES
                }
                for model in models
            },
        }

    async def run(self) -> None:
        """Samples forever (until cancelled). The read runs in a thread: with many worker processes it is many
        files, and the event loop serves every stream meanwhile."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                families = await asyncio.to_thread(self.collect)
            except Exception:  # a failed read is a gap in the charts, never a stop of the sampling
                logger.exception("reading the metrics for the dashboard's history failed")
                continue
            self.record(families, time.time())


_installed: MetricsHistory | None = None


def install_history(history: MetricsHistory | None) -> None:
    """Makes `history` the one the dashboard reads (the control plane installs it while it runs)."""
    global _installed
    _installed = history


def installed_history() -> MetricsHistory | None:
    """The process's history, or None when the engine does not run in this process."""
    return _installed
