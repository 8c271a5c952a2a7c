"""What a worker records of one served model (the definitions: contract/metrics.py; docs/metrics.md).

One `ModelMetrics` per hosted model, its label children bound once, so a decode step pays a few locked writes and
no label lookups. Its callers are the places where each figure changes: the scheduler (a sequence takes a slot, a
token is appended, a sequence ends), the worker's loop (the occupancy gauges, read by HostedModel.record_occupancy
once per loop turn before the turn's outputs are sent, so a client that has its answer finds the gauges already past
it; and when a model is loaded or unloaded) and the weights barrier (its state, a commit, a hold released). A
scheduler or barrier built without one (tests, the engine's command line) records nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference.engine.contract import metrics as m

if TYPE_CHECKING:
    from inference.engine.sequence import Sequence

WEIGHTS_STATES = ("clean", "writing", "torn")  # the barrier's weights states (spec: "Weights")


class ModelMetrics:
    def __init__(self, model: str):
        self.model = model
        self.first_token = m.TIME_TO_FIRST_TOKEN.labels(model)
        self.token_gap = m.INTER_TOKEN_LATENCY.labels(model)
        self.prompt_tokens = m.PROMPT_TOKENS.labels(model)
        self.cached_tokens = m.CACHED_PROMPT_TOKENS.labels(model)
        self.completion_tokens = m.COMPLETION_TOKENS.labels(model)
        self.queue_wait = m.QUEUE_WAIT.labels(model)
        self.queue_depth = m.QUEUE_DEPTH.labels(model)
        self.decoding = m.SEQUENCES_DECODING.labels(model)
        self.blocks_used = m.KV_BLOCKS_USED.labels(model)
        self.blocks_free = m.KV_BLOCKS_FREE.labels(model)
        self.sessions = m.SESSIONS_RESIDENT.labels(model)
        self.states = {state: m.WEIGHTS_STATE.labels(model, state) for state in WEIGHTS_STATES}
        self.commits = m.WEIGHTS_COMMITS.labels(model)
        self.hold = m.WEIGHTS_BARRIER_HOLD.labels(model)
        self.last_occupancy: tuple[int, ...] | None = None

    # -- the scheduler --------------------------------------------------------------------------------------------

    def took_slot(self, seq: Sequence, now: float) -> None:
        self.queue_wait.observe(now - seq.arrival)

    def token(self, seq: Sequence, now: float) -> None:
        """A token was appended to `seq`: its first token's latency from arrival, else the gap since the last."""
        if seq.token_at:
            self.token_gap.observe(now - seq.token_at)
        else:
            self.first_token.observe(now - seq.arrival)
        seq.token_at = now

    def ended(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> None:
        """A sequence finished: its usage, exactly as its FINISHED reports it."""
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.completion_tokens.inc(completion_tokens)

    # -- the worker's loop ----------------------------------------------------------------------------------------

    def occupancy(self, *, waiting: int, decoding: int, blocks_used: int, blocks_free: int, sessions: int) -> None:
        """Sets the gauges, only when a figure changed (each set is a locked write to the metrics file, and the
        loop turns far more often than the figures change)."""
        figures = (waiting, decoding, blocks_used, blocks_free, sessions)
        if figures == self.last_occupancy:
            return
        self.last_occupancy = figures
        self.queue_depth.set(waiting)
        self.decoding.set(decoding)
        self.blocks_used.set(blocks_used)
        self.blocks_free.set(blocks_free)
        self.sessions.set(sessions)

    def unloaded(self) -> None:
        """The model left the worker: its gauges read 0 (a file's value cannot be taken back while we live)."""
        self.last_occupancy = None
        for gauge in (self.queue_depth, self.decoding, self.blocks_used, self.blocks_free, self.sessions,
                      *self.states.values()):  # fmt: skip
            gauge.set(0)

    # -- the weights barrier --------------------------------------------------------------------------------------

    def weights_state(self, state: str) -> None:
        for name, gauge in self.states.items():
            gauge.set(1 if name == state else 0)

    def committed(self) -> None:
        self.commits.inc()

    def hold_released(self, seconds: float) -> None:
        self.hold.observe(seconds)
