"""Times on the weights routes: the worker reports seconds since the epoch, every route shows ISO 8601 (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# The keys whose values the worker reports as epoch seconds; every route shows them as ISO 8601.
TIME_KEYS = frozenset(
    {"at", "attached_at", "began_at", "hold_deadline", "last_heartbeat_at", "quiesced_at", "stale_since"}
)


def iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def with_iso_times(value: Any) -> Any:
    """`value` (a route's data or an error's details) with every TIME_KEYS number written as ISO 8601."""
    if isinstance(value, dict):
        return {
            k: iso(v) if k in TIME_KEYS and isinstance(v, int | float) else with_iso_times(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [with_iso_times(v) for v in value]
    return value
