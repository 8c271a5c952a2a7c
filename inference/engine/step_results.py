"""What one scheduler step produced, as plain results: a sequence admitted to a slot, tokens streamed (or a scored
prompt), a sequence ended, a waiting one refused. The scheduler returns these, in order; the worker turns each into
the protocol's message (step_wire.py), so the scheduler knows nothing of the wire and the wire nothing of the
scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from inference.engine.contract.messages import TokenLogprob


@dataclass(slots=True)
class Admitted:
    """A sequence took a decode slot: its prompt's length, how much of it was already in the KV, the window."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    kv_cap: int
    thinking: bool  # the prompt left a think block open: the output begins inside it


@dataclass(slots=True)
class Streamed:
    """Tokens a sequence produced this step and the text they release, with their log-probabilities when asked for;
    or, with no tokens, its scored prompt (`prompt_logprobs`)."""

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class Ended:
    """A sequence finished: why, and what it used."""

    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_used: int
    kv_cap: int
    session_conflict: bool
    grammar_complete: bool | None  # None: no grammar constrained it


@dataclass(slots=True)
class Expired:
    """A waiting sequence no decode slot took within the queue timeout; it is refused."""

    request_id: str
    message: str


StepResult = Admitted | Streamed | Ended | Expired
