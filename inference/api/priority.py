"""Which priority a /v1 request runs at: `X-Pantheon-Priority`, "interactive" (the default) or "batch".

The Batch API's runner sends its lines with "batch", so they run in the slots interactive requests leave
(ServingLimits.batch_slots, scheduler.py) and wait while a trainer holds the weights (503 weights_held).
"""

from __future__ import annotations

from typing import get_args

from inference.engine.contract.params import Priority
from pantheon_site.errors import InvalidRequest

PRIORITY_HEADER = "X-Pantheon-Priority"
PRIORITIES: tuple[str, ...] = get_args(Priority)


def request_priority(headers) -> Priority:
    """The request's priority from its headers; 400 invalid_request_error naming the header for any other value."""
    value = headers.get(PRIORITY_HEADER)
    if value is None:
        return "interactive"
    priority = value.strip().lower()
    if priority not in PRIORITIES:
        raise InvalidRequest(
            f"{PRIORITY_HEADER} must be one of {', '.join(PRIORITIES)}; got {value[:40]!r}", reason="priority_header"
        )
    return priority
