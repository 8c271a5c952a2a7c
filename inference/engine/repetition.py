"""Noticing that a decode is stuck in a loop, so the scheduler can end it instead of spending the rest of
`max_tokens` on the same few tokens (finish_reason "repetition_loop").

A loop is a periodic tail: the last `span` generated tokens repeat one period p, 1 <= p <= span // 4 (so at least
four repeats), i.e. out[i] == out[i - p] for each of those positions after the first p. The detector keeps, per
period, how many consecutive positions so far matched the token p back, so each new token costs one comparison per
period and the tail is never scanned again.
"""

from __future__ import annotations

NO_TOKEN = -1  # fills the history before `max_period` tokens have come; no token id is negative


class RepetitionDetector:
    """Fed each generated token id in order; `push` says whether the output now ends in a loop of `span` tokens.
    A span of 0 is off, as is any span under 4 (no period repeats four times in it)."""

    __slots__ = ("span", "max_period", "_recent", "_next", "_runs")

    def __init__(self, span: int):
        if span < 0:
            raise ValueError(f"span must be 0 (off) or positive, got {span}")
        self.span = span
        self.max_period = span // 4
        self._recent = [NO_TOKEN] * self.max_period  # the last max_period tokens, a ring; `_next` is the oldest
        self._next = 0
        self._runs = [0] * (self.max_period + 1)  # per period p: consecutive positions where out[i] == out[i - p]

    def push(self, token_id: int) -> bool:
        """Records the next generated token; True when the last `span` tokens are periodic."""
        recent, runs, size = self._recent, self._runs, self.max_period
        if not size:
            return False
        looping = False
        for period in range(1, size + 1):
            if recent[(self._next - period) % size] == token_id:
                runs[period] += 1
                looping = looping or runs[period] >= self.span - period
            else:
                runs[period] = 0
        recent[self._next] = token_id
        self._next = (self._next + 1) % size
        return looping
