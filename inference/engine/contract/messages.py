"""The messages between the control plane and a worker process, and how they travel.

Every message is one ZMQ frame: a msgspec Struct encoded as a msgpack array, its one-letter tag first and then its
fields in declaration order (positional, so a frame carries no field names). Code builds every message by keyword;
the receiver decodes with type checks against the union of what it may receive (`ToWorker` or `FromWorker`), so a
field of the wrong type (a `top_k` of "5") fails decoding of that one message, and the worker answers its request
with ERROR bad_request instead of letting the value reach a batched step.

Requests and their replies are matched by `request_id`, which the control plane chooses: a generation's id for
SUBMIT/ABORT and the stream that answers it, a call id for LOAD, UNLOAD, STATUS, PAUSE and RESUME. One socket
therefore multiplexes any number of generations and calls. What one worker step produces for its generations
travels as one STEP_OUTPUTS message; everything else, including a refusal at submission, travels alone. The
session calls (SESSION_EXPORT, _RESTORE, _RELEASE, _WATCH, _LIST) are calls too, each answered by its reply or ERROR.

A worker never names an HTTP status or error type: an ERROR carries a `Reason` (contract/reasons.py) and the data
that goes with it, and the control plane alone decides what the client sees.

The control plane's messages are in requests.py, their base in message_base.py; the worker's replies are here, with
the unions each side decodes and the codec. This module imports msgspec and the contract's own modules only, so the
control plane speaks it without torch.
"""

from __future__ import annotations

from typing import Any

import msgspec

from inference.engine.contract.dialects.base import DEFAULT_DIALECT, ToolDialect
from inference.engine.contract.message_base import Message, ProtocolError
from inference.engine.contract.reasons import Reason
from inference.engine.contract.requests import (
    Abort,
    Embed,
    Load,
    Pause,
    Resume,
    SessionExport,
    SessionList,
    SessionRelease,
    SessionRestore,
    SessionWatch,
    Shutdown,
    StatusQuery,
    Submit,
    Unload,
    WeightsRequest,
)
from inference.engine.contract.weights import Answer, WeightsCode, WeightsSnapshot

# -- worker -> control plane ----------------------------------------------------------------------------------------


class Ready(Message, tag="r"):
    """The worker's first message: its loop runs and it accepts requests. `cuda_devices` is how many CUDA devices
    the worker's torch sees, so the control plane can start one worker per GPU without importing torch itself."""

    device: str
    pid: int
    cuda_devices: int = 0


class Heartbeat(Message, tag="h"):
    """Sent about every `--heartbeat-interval` seconds by a live worker loop, idle or busy."""

    pid: int


class Started(Message, tag="s"):
    """A generation was admitted to a decode slot: its prompt is counted and it will now produce tokens. `thinking`:
    the prompt opened a think block, so the output starts inside it."""

    request_id: str
    prompt_tokens: int
    cached_tokens: int
    kv_cap: int
    thinking: bool = False


class TopLogprob(msgspec.Struct, array_like=True, kw_only=True):
    token_id: int
    token: bytes  # the raw bytes the token stands for
    logprob: float


class TokenLogprob(msgspec.Struct, array_like=True, kw_only=True):
    """The log-probability of one chosen token and, when asked for, the best alternatives at its position. `text` is
    what the token added to the text the client received: its bytes as text, except where decoding differs (a
    SentencePiece first token's leading space is dropped; a token that ends in half a UTF-8 character adds it only
    with the next token; a stop string cuts it), so the chosen tokens' texts spell the output exactly."""

    token_id: int
    token: bytes
    logprob: float | None  # None only for a prompt's first token, which nothing before it scores
    text: str = ""
    top: list[TopLogprob] = []


class Tokens(Message, tag="t"):
    """New tokens of one generation, and the text they completed. `text` can be empty while a token finishes half a
    UTF-8 character or might start a stop string; it is never a partial stop string. For a SUBMIT with
    prompt_logprobs, the first TOKENS (no token ids, no text) carries the prompt's: an entry per prompt token, with
    the text it adds to the decoded prompt; the first has no log-probability."""

    request_id: str
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None


class Finished(Message, tag="f"):
    """The last message of a generation that ended normally; `finish_reason` is "stop", "length" or "repetition_loop".
    `cached_tokens` prompt tokens were reused from the prefix cache; `kv_used` is the KV the sequence (for a session
    turn: its conversation) holds after the turn; `session_conflict` says that conversations of its session id competed,
    so this turn could not resume the one it continues. `grammar_complete` (None without a grammar) says whether the
    output is a complete sentence of the request's grammar."""

    request_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    kv_used: int
    kv_cap: int
    session_conflict: bool = False
    grammar_complete: bool | None = None


class Error(Message, tag="e"):
    """A request refused or failed (or, with `request_id` None, a frame that could not be read): why, in words for
    the client, and the numbers that go with some reasons (`kv_used`/`kv_cap` for prompt_too_long)."""

    request_id: str | None
    reason: Reason
    message: str
    kv_used: int | None = None
    kv_cap: int | None = None


class DecodeGraphs(msgspec.Struct, array_like=True, kw_only=True, forbid_unknown_fields=True):
    """How a model's decode step runs (execution/compiled_step.py): `mode` "compiled" (torch.compile, CPU),
    "cuda_graphs" (a captured CUDA graph per bucket) or "eager"; the batch-size `buckets` holding a graph; the
    warm-up's milliseconds at load; and why it runs eagerly when it was asked to compile (`fallback_reason`: the
    warm-up failed, or a step did and every later one runs eagerly). Mode "eager" with no reason: not asked for."""

    mode: str = "eager"
    buckets: list[int] = msgspec.field(default_factory=list)
    warmup_ms: float = 0.0
    fallback_reason: str | None = None


class TensorParallel(msgspec.Struct, array_like=True, kw_only=True, forbid_unknown_fields=True):
    """A model split across `ranks` (engine/parallel/): the all-reduce's `backend` ("gloo" or "nccl") and the
    process ids of the follower ranks (rank 0 is the worker). Its decode runs the eager forward: no decode plan and
    no compiled graphs (docs/tensor-parallel.md)."""

    ranks: int
    backend: str
    follower_pids: list[int]
    decode: str = "eager"


class Loaded(Message, tag="l"):
    """A LOAD succeeded. `context_window` is the window that fit in memory (every completion's kv_cap);
    `context_window_configured` the one asked for (or the model's default)."""

    request_id: str
    name: str
    path: str
    format: str
    architecture: str
    device: str
    dtype: str
    weight_bytes: int
    kv_bytes: int  # the KV pool's bytes for the sequences' full windows; the prefix cache's are prefix_cache_bytes
    kv_dtype: str  # the KV pool's dtype ("float32", "float16", ...): the load option's, or the automatic choice
    context_window: int
    context_window_configured: int
    max_concurrent: int
    load_seconds: float
    weights_version: int  # changes whenever the served weights change; session blobs carry it
    tool_dialect: ToolDialect = DEFAULT_DIALECT  # how the model writes tool calls (the control plane parses them)
    # A think block may come before a grammar's answer (its template opens the block in the prompt, or the model
    # opens it with its one `<think>` token): the grammar then waits for `</think>`.
    thinks_before_grammar: bool = False
    weights: WeightsSnapshot | None = None  # the model's weights barrier as loaded
    # How many linear layers hold their weights in each in-memory format ("int4", "int8", "float32", ...).
    linear_formats: dict[str, int] = msgspec.field(default_factory=dict)
    graphs: DecodeGraphs = msgspec.field(default_factory=DecodeGraphs)  # the decode step as loaded
    prefix_cache_bytes: int = 0  # the KV pool's bytes beyond the sequences' full windows (kv_budget.py)
    # The C kernels the worker runs ("block_matmul", "paged_attention", ...; kernels.active_kernels): empty when
    # they are off (PANTHEON_KERNELS=off) or were not built, and torch's ops do all of it.
    kernels: list[str] = msgspec.field(default_factory=list)
    tensor_parallel: TensorParallel | None = None  # a split model's ranks; None: one device
    attention: str = "gather"  # how attention reads the KV pool ("gather", "flex"): the load option's, or the default


class Unloaded(Message, tag="u"):
    request_id: str
    name: str
    aborted: int  # generations still running at the drain deadline, ended with ERROR model_unloaded


class ModelStatus(msgspec.Struct, array_like=True, kw_only=True):
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
    blocks_total: int  # the KV pool, in blocks of `block_size` positions
    blocks_free: int  # held by no sequence or session (cached ones included: they are reclaimed on demand)
    blocks_cached: int  # free blocks that still hold a reusable prefix
    blocks_pinned: int  # held by sessions between turns
    block_size: int
    sessions: int  # session ids holding KV
    prefill_tok_per_s: float  # measured prefill rate (0 before the first prefill)
    graphs: DecodeGraphs = msgspec.field(default_factory=DecodeGraphs)  # the decode step now (it may fall back)
    prefix_cache_bytes: int = 0  # as in Loaded
    prefix_lookup_tokens: int = 0  # prompt tokens looked up in the prefix cache since the load
    prefix_hit_tokens: int = 0  # of those, the tokens whose KV was reused
    host_offloaded_blocks: int = 0  # blocks the pool's evictions copied to the host tier since the load
    host_restored_blocks: int = 0  # blocks copied back from it on a prefix hit
    host_bytes: int = 0  # bytes of KV the host tier holds now (at most the load's host_cache_mb)
    batch_running: int = 0  # of `running`, the batch-priority sequences (at most the load's batch_slots)
    batch_waiting: int = 0  # of `waiting`, the batch-priority sequences (their own line: scheduler.py)
    batch_slots: int = 0  # the slots batch-priority sequences may hold


class Status(Message, tag="i"):
    request_id: str
    device: str
    pid: int
    memory_total: int  # bytes of the device (host RAM for cpu)
    memory_used: int
    models: list[ModelStatus]


class SessionBlob(Message, tag="x"):
    """An exported conversation: `blob` (the format of session_blob.py) and the `tokens` its KV covers."""

    request_id: str
    session_id: str
    weights_version: int
    tokens: list[int]
    blob: bytes


class SessionRestored(Message, tag="o"):
    request_id: str
    session_id: str
    n_tok: int


class SessionReleased(Message, tag="d"):
    request_id: str
    session_id: str
    released: bool  # whether the session held anything


class SessionWatched(Message, tag="w"):
    request_id: str
    session_id: str
    watchers: int  # watches open on the session now


class SessionInfo(msgspec.Struct, array_like=True, kw_only=True):
    session_id: str
    conversations: int
    tokens: int  # KV positions its conversations hold
    idle_seconds: float  # since its last turn, restore or watch change
    watched: bool
    busy: bool  # a turn is in flight


class Sessions(Message, tag="z"):
    request_id: str
    model: str
    sessions: list[SessionInfo]


class Paused(Message, tag="p"):
    request_id: str


class Resumed(Message, tag="q"):
    request_id: str


class Embeddings(Message, tag="m"):
    """One L2-normalised float32 vector per input (little-endian bytes), and each input's token count."""

    request_id: str
    vectors: list[bytes]
    prompt_tokens: list[int]


class WeightsReply(Message, tag="k"):
    """A weights call carried out: what it answers (the route's `data`), and the barrier after it."""

    request_id: str
    data: Answer
    snapshot: WeightsSnapshot


class WeightsRefused(Message, tag="n"):
    """A weights call refused: the spec's `code` (NOT_ATTACHED, WEIGHTS_NOT_CLEAN, ...), its `reason` when the spec
    names one (drain_timeout, quiesce_in_progress, gguf, ...), what to tell the caller, and the barrier as it is."""

    request_id: str
    code: WeightsCode
    message: str
    reason: str | None = None
    details: dict[str, Any] = {}
    snapshot: WeightsSnapshot | None = None


class LoadProgress(Message, tag="j"):
    """How far the load of `name` has read its checkpoint: tensors and bytes (as stored in the file) of the totals.
    Sent while the load runs, when the counts moved, at most every LOAD_PROGRESS_INTERVAL seconds."""

    name: str
    tensors_read: int
    tensors_total: int
    bytes_read: int
    bytes_total: int


class WeightsChanged(Message, tag="g"):
    """A model's barrier changed without a call: the watchdog tore the set, a hold timed out, an attachment went
    stale."""

    snapshot: WeightsSnapshot


StepOutput = Started | Tokens | Finished | Error  # what STEP_OUTPUTS may carry


class StepOutputs(Message, tag="b"):
    """Everything one worker step produced (STARTED, TOKENS, FINISHED, ERROR of its generations), in order, as one
    message: one ZMQ send per token cost a tiny model a sixth of its worker time (docs/performance.md). The receiver
    handles each inner message as if it had come alone."""

    messages: list[StepOutput]


ToWorker = (
    Submit
    | Abort
    | Load
    | Unload
    | StatusQuery
    | Pause
    | Resume
    | SessionExport
    | SessionRestore
    | SessionRelease
    | SessionWatch
    | SessionList
    | WeightsRequest
    | Embed
    | Shutdown
)
FromWorker = (
    Ready
    | Heartbeat
    | Started
    | Tokens
    | Finished
    | Error
    | Loaded
    | Unloaded
    | Status
    | Paused
    | Resumed
    | SessionBlob
    | SessionRestored
    | SessionReleased
    | SessionWatched
    | Sessions
    | Embeddings
    | WeightsReply
    | WeightsRefused
    | WeightsChanged
    | LoadProgress
    | StepOutputs
)

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def encode(message: Message) -> bytes:
    """The frame that carries `message`."""
    return _encoder.encode(message)


def decode_to_worker(frame: bytes) -> ToWorker:
    """A message for a worker; ProtocolError (with the request id it seemed to carry) for anything else."""
    return _decode(_to_worker, frame)


def decode_from_worker(frame: bytes) -> FromWorker:
    """A message from a worker; ProtocolError for anything else."""
    return _decode(_from_worker, frame)


def _decode(decoder: msgspec.msgpack.Decoder, frame: bytes) -> Message:
    try:
        return decoder.decode(frame)
    except msgspec.DecodeError as exc:  # ValidationError too: a malformed or mistyped field
        raise ProtocolError(f"bad message: {exc}", _request_id_of(frame)) from exc


def _request_id_of(frame: bytes) -> str | None:
    """The request id a frame that failed typed decoding seems to carry: its second element, if a string."""
    try:
        values = msgspec.msgpack.decode(frame)
    except msgspec.DecodeError:
        return None
    if isinstance(values, list) and len(values) > 1 and isinstance(values[1], str):
        return values[1]
    return None
