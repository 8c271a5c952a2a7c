"""Noticing that a decode is stuck in a loop, so the scheduler can end it instead of spending the rest of
`max_tokens` on the same few tokens (finish_reason "repetition_loop").

A loop is a periodic tail: the last `span` generated tokens repeat one period p, 1 <= p <= span // 4 (so at least
four repeats), i.e. out[i] == out[i - p] for each of those positions after the first p. The detector keeps, per
period, how many consecutive positions so far matched the token p back, so the tail is never scanned again; and it
keeps where each token occurs among the last span // 4, so a new token visits only the periods at which it repeats
(all others start over at 0) rather than every period (docs/performance.md).
"""

from __future__ import annotations

from collections import deque


class RepetitionDetector:
    """Fed each generated token id in order; `push` says whether the output now ends in a loop of `span` tokens.
    A span of 0 is off, as is any span under 4 (no period repeats four times in it)."""

    __slots__ = ("span", "max_period", "_count", "_window", "_positions", "_runs")

    def __init__(self, span: int):
        if span < 0:
            raise ValueError(f"span must be 0 (off) or positive, got {span}")
        self.span = span
        self.max_period = span // 4
        self._count = 0  # tokens pushed so far
        self._window: deque[int] = deque()  # the last max_period tokens, oldest first
        self._positions: dict[int, deque[int]] = {}  # token id -> where it occurs in the window (push counts)
        self._runs: dict[int, int] = {}  # period -> consecutive positions where out[i] == out[i - period]; absent: 0

    def push(self, token_id: int) -> bool:
        """Records the next generated token; True when the last `span` tokens are periodic."""
        size = self.max_period
        if not size:
            return False
        now, previous, runs = self._count, self._runs, {}
        looping = False
        for position in self._positions.get(token_id, ()):
            period = now - position
            run = runs[period] = previous.get(period, 0) + 1
            looping = looping or run >= self.span - period
        self._runs = runs
        if len(self._window) == size:  # the oldest token leaves the window
            leaving = self._window.popleft()
            held = self._positions[leaving]
            held.popleft()
            if not held:
                del self._positions[leaving]
        self._window.append(token_id)
        self._positions.setdefault(token_id, deque()).append(now)
        self._count = now + 1
        return looping
