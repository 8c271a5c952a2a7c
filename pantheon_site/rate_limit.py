"""A rate limit per access token (PANTHEON_RATE_LIMIT_PER_MINUTE), kept in the serve process's memory.

Each token has a bucket that holds up to a minute's allowance and refills continuously at that rate, so a client may
spend its allowance in a burst and then goes on at the steady rate; a call that finds the bucket empty is refused
with 429 `rate_limited` and a Retry-After of the seconds until one call's worth has refilled. Every call a token
makes counts, refused ones included, so a token that floods a route it may not call is slowed down too.

0, the default, turns it off: vLLM, llama.cpp's server and Ollama limit nothing per client, and a server run for
oneself should not either; capacity is protected by the queue (429 `server_busy`), not by this. An operator who
shares a server with others sets a limit (docs/security.md).

A check is a dict lookup and a few float operations under a lock: no database work, so /v1 costs nothing more than
its token lookup. The buckets are this process's: a fleet of servers behind one balancer would need a shared store
(Redis) to enforce one limit across them; today each server counts only the calls it serves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django.conf import settings

from pantheon_site.errors import RateLimited


class TokenBuckets:
    """One bucket per key (a token's digest): `take` spends one call's allowance or says how long to wait."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (allowance left, when it was counted)

    def take(self, key: str, per_minute: int) -> float:
        """0.0 when the call is admitted (and counted); else the seconds until the bucket holds one call again."""
        rate = per_minute / 60.0
        now = self._clock()
        with self._lock:
            allowance, counted = self._buckets.get(key, (float(per_minute), now))
            allowance = min(float(per_minute), allowance + (now - counted) * rate)
            if allowance >= 1.0:
                self._buckets[key] = (allowance - 1.0, now)
                return 0.0
            self._buckets[key] = (allowance, now)
            return (1.0 - allowance) / rate


_BUCKETS = TokenBuckets()


def check_rate(token_key: str) -> None:
    """Counts one call of the token whose digest is `token_key`; raises RateLimited when it is over its limit."""
    per_minute = settings.PANTHEON_RATE_LIMIT_PER_MINUTE
    if per_minute <= 0:
        return
    wait = _BUCKETS.take(token_key, per_minute)
    if wait > 0:
        raise RateLimited(retry_after=wait, reason="rate_limit")
