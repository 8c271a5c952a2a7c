"""The messages between the control plane and a worker process, and how they travel.

Every message is two ZMQ frames: a one-byte kind and a msgpack array of the dataclass's fields in declaration order
(positional, so a frame carries no field names). Requests and their replies are matched by `request_id`, which the
control plane chooses: a generation's id for SUBMIT/ABORT and the stream that answers it, a call id for LOAD,
UNLOAD, STATUS, PAUSE and RESUME. One socket therefore multiplexes any number of generations and calls. What one
worker step produces for its generations travels as one STEP_OUTPUTS message (see StepOutputs); everything else,
including a generation's refusal at submission, travels alone.

This module imports nothing but msgpack, so the control plane can speak the protocol without importing torch.
Sampling parameters travel as a plain dict of `inference.engine.sampler.SamplingParams` fields for the same reason.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, fields
from typing import Any, ClassVar

import msgpack


class ProtocolError(ValueError):
    """A frame that is not a message of this protocol. `request_id` is the id the frame seemed to carry (its first
    field, when that is a string), so the receiver can still fail that one request instead of leaving it waiting."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


# -- control plane -> worker ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Submit:
    """Start a generation. Exactly one of `messages` (rendered with the model's chat template in the worker) and
    `prompt_token_ids` is set. Answered by STARTED, then TOKENS..., then FINISHED, or by one ERROR at any point."""

    KIND: ClassVar[bytes] = b"S"
    request_id: str
    model: str
    messages: list[dict[str, Any]] | None = None
    prompt_token_ids: list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int = 1024
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass(slots=True)
class Abort:
    """Drop a generation now and free its KV slot. Unknown or finished ids are ignored (abort is idempotent)."""

    KIND: ClassVar[bytes] = b"A"
    request_id: str


@dataclass(slots=True)
class Load:
    """Load a checkpoint under a served name. Answered by LOADED or ERROR(load_failed).

    `max_context` 0 means the model's own window; `max_concurrent` is how many sequences decode together;
    `queue_depth` how many more may wait for a slot (0: a busy model refuses at once with server_busy);
    `queue_timeout` how long one may wait before it is refused; `min_free_memory` the bytes of free device memory
    below which a new generation is refused with server_memory_constrained (0: never)."""

    KIND: ClassVar[bytes] = b"L"
    request_id: str
    name: str
    path: str
    quantize: bool = False
    dtype: str | None = None
    max_context: int = 0
    max_concurrent: int = 1
    queue_depth: int = 0
    queue_timeout: float = 30.0
    prefill_chunk: int = 128
    min_free_memory: int = 0


@dataclass(slots=True)
class Unload:
    """Stop admitting to a model, let its generations finish for up to `drain_timeout` seconds, then free it.
    Generations still running at the deadline are aborted (each gets ERROR model_unloaded) when `force`; without
    `force` the unload is called off instead (ERROR unload_failed, 409) and the model serves on. Unloading a model
    that is still loading drops it when its load ends. Answered by UNLOADED or ERROR(unload_failed)."""

    KIND: ClassVar[bytes] = b"U"
    request_id: str
    name: str
    drain_timeout: float = 30.0
    force: bool = True


@dataclass(slots=True)
class StatusQuery:
    """Ask for the worker's models, memory and queues. Answered by STATUS."""

    KIND: ClassVar[bytes] = b"?"
    request_id: str


@dataclass(slots=True)
class Pause:
    """Stop admitting new sequences to `model` (None: every model); answered by PAUSED once none is running, at a
    step boundary. Submissions keep queueing meanwhile."""

    KIND: ClassVar[bytes] = b"P"
    request_id: str
    model: str | None = None


@dataclass(slots=True)
class Resume:
    """Undo PAUSE; answered by RESUMED at once."""

    KIND: ClassVar[bytes] = b"R"
    request_id: str
    model: str | None = None


@dataclass(slots=True)
class Shutdown:
    """Abort everything (each generation gets ERROR server_shutting_down) and exit the worker loop."""

    KIND: ClassVar[bytes] = b"X"


# -- worker -> control plane ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Ready:
    """The worker's first message: its loop runs and it accepts requests. `cuda_devices` is how many CUDA devices
    the worker's torch sees, so the control plane can start one worker per GPU without importing torch itself."""

    KIND: ClassVar[bytes] = b"r"
    device: str
    pid: int
    cuda_devices: int = 0


@dataclass(slots=True)
class Heartbeat:
    """Sent about every half second by a live worker loop, idle or busy."""

    KIND: ClassVar[bytes] = b"h"
    pid: int


@dataclass(slots=True)
class Started:
    """A generation was admitted to a decode slot: its prompt is counted and it will now produce tokens."""

    KIND: ClassVar[bytes] = b"s"
    request_id: str
    prompt_tokens: int
    cached_tokens: int
    kv_cap: int


@dataclass(slots=True)
class TopLogprob:
    token_id: int
    token: bytes  # the raw bytes the token stands for
    logprob: float


@dataclass(slots=True)
class TokenLogprob:
    """The log-probability of one chosen token and, when asked for, the best alternatives at its position."""

    token_id: int
    token: bytes
    logprob: float
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(slots=True)
class Tokens:
    """New tokens of one generation, and the text they completed. `text` can be empty while a token finishes half a
    UTF-8 character or might start a stop string; it is never a partial stop string."""

    KIND: ClassVar[bytes] = b"t"
    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None

    def to_wire(self) -> list[Any]:
        lps = None
        if self.logprobs is not None:
            lps = [[lp.token_id, lp.token, lp.logprob, [astuple(t) for t in lp.top]] for lp in self.logprobs]
        return [self.request_id, self.token_ids, self.text, lps]

    @classmethod
    def from_wire(cls, values: list[Any]) -> Tokens:
        request_id, token_ids, text, lps = values
        if lps is not None:
            lps = [TokenLogprob(tid, tok, lp, [TopLogprob(*t) for t in top]) for tid, tok, lp, top in lps]
        return cls(request_id, token_ids, text, lps)


@dataclass(slots=True)
class Finished:
    """The last message of a generation that ended normally; `finish_reason` is "stop" or "length"."""

    KIND: ClassVar[bytes] = b"f"
    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_used: int
    kv_cap: int


@dataclass(slots=True)
class Error:
    """A request failed (or, with `request_id` None, a message could not be read). `type` is the API's error type
    (server_busy, context_over_budget, load_failed, ...) and `status` the HTTP status the spec gives it, so the
    control plane renders it without a translation table."""

    KIND: ClassVar[bytes] = b"e"
    request_id: str | None
    type: str
    message: str
    status: int = 500
    retry_after: float | None = None
    kv_used: int | None = None
    kv_cap: int | None = None


@dataclass(slots=True)
class Loaded:
    KIND: ClassVar[bytes] = b"l"
    request_id: str
    name: str
    path: str
    format: str
    architecture: str
    device: str
    dtype: str
    weight_bytes: int
    kv_bytes: int
    context_window: int
    max_concurrent: int
    load_seconds: float
    context_window_configured: int = 0  # the window asked for (or the model's default); context_window is what fit


@dataclass(slots=True)
class Unloaded:
    KIND: ClassVar[bytes] = b"u"
    request_id: str
    name: str
    aborted: int  # generations still running at the drain deadline, ended with ERROR model_unloaded


@dataclass(slots=True)
class ModelStatus:
    name: str
    path: str
    state: str  # "ready", "paused" or "draining"
    weight_bytes: int
    kv_bytes: int
    slots_used: int
    slots_total: int
    running: int
    waiting: int
    max_concurrent: int
    context_window: int


@dataclass(slots=True)
class Status:
    KIND: ClassVar[bytes] = b"i"
    request_id: str
    device: str
    pid: int
    memory_total: int  # bytes of the device (host RAM for cpu)
    memory_used: int
    models: list[ModelStatus]

    def to_wire(self) -> list[Any]:
        return [self.request_id, self.device, self.pid, self.memory_total, self.memory_used,
                [astuple(m) for m in self.models]]  # fmt: skip

    @classmethod
    def from_wire(cls, values: list[Any]) -> Status:
        *head, models = values
        return cls(*head, [ModelStatus(*m) for m in models])


@dataclass(slots=True)
class Paused:
    KIND: ClassVar[bytes] = b"p"
    request_id: str


@dataclass(slots=True)
class Resumed:
    KIND: ClassVar[bytes] = b"q"
    request_id: str


@dataclass(slots=True)
class StepOutputs:
    """Everything one worker step produced (STARTED, TOKENS, FINISHED, ERROR of its generations), in order, as one
    message: at 8 streams a step made 8 sends, and one ZMQ send per token cost ~16% of a tiny model's worker time.
    The receiver handles each inner message as if it had come alone. On the wire they are one flat msgpack array
    [kind, fields, kind, fields, ...], the kind as its byte's integer value, so a step packs in one call and costs
    the bytes its messages cost alone plus one array header."""

    KIND: ClassVar[bytes] = b"b"
    messages: list[StepOutput]

    def to_wire(self) -> list[Any]:
        values: list[Any] = []
        for message in self.messages:
            values += (message.KIND[0], _to_values(message))
        return values

    @classmethod
    def from_wire(cls, values: list[Any]) -> StepOutputs:
        if len(values) % 2:
            raise ValueError("not [kind, fields] pairs")
        messages = []
        for kind, fields_ in zip(values[::2], values[1::2], strict=True):
            if kind not in _STEP_KINDS:
                raise ValueError(f"kind {kind!r} is not a step output")
            messages.append(_from_values(_STEP_KINDS[kind], fields_))
        return cls(messages)


Message = (
    Submit | Abort | Load | Unload | StatusQuery | Pause | Resume | Shutdown
    | Ready | Heartbeat | Started | Tokens | Finished | Error | Loaded | Unloaded | Status | Paused | Resumed
    | StepOutputs
)  # fmt: skip

StepOutput = Started | Tokens | Finished | Error  # what StepOutputs may carry

_BY_KIND: dict[bytes, type] = {cls.KIND: cls for cls in Message.__args__}
_STEP_KINDS: dict[int, type] = {cls.KIND[0]: cls for cls in StepOutput.__args__}


def encode(message: Message) -> list[bytes]:
    """The two frames that carry `message`."""
    return [message.KIND, msgpack.packb(_to_values(message), use_bin_type=True)]


def decode(frames: list[bytes]) -> Message:
    """The message two frames carry; raises ProtocolError for anything else."""
    if len(frames) != 2 or frames[0] not in _BY_KIND:
        raise ProtocolError(f"not a protocol message: {len(frames)} frames, kind {frames[0][:1]!r}")
    cls = _BY_KIND[frames[0]]
    values = None
    try:
        values = msgpack.unpackb(frames[1], raw=False, strict_map_key=False)  # logit_bias maps token ids
        return _from_values(cls, values)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        request_id = values[0] if isinstance(values, list) and values and isinstance(values[0], str) else None
        raise ProtocolError(f"bad {cls.__name__} payload: {exc}", request_id) from exc


def _to_values(message: Message) -> list[Any]:
    to_wire = getattr(message, "to_wire", None)
    return to_wire() if to_wire else [getattr(message, f.name) for f in fields(message)]


def _from_values(cls: type, values: list[Any]) -> Message:
    from_wire = getattr(cls, "from_wire", None)
    return from_wire(values) if from_wire else cls(*values)
