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

This module imports msgspec and the contract's own modules only, so the control plane speaks it without torch.
"""

from __future__ import annotations

from typing import Any

import msgspec

from inference.engine.contract.params import TOP_LOGPROBS_LIMIT, LoadOptions, SamplingParams, ServingLimits
from inference.engine.contract.reasons import Reason
from inference.engine.contract.tool_dialect import DEFAULT_DIALECT, ToolDialect, ToolGrammarMode
from inference.engine.contract.weights import ServedCheckpoint, WeightsCall, WeightsSnapshot


class ProtocolError(ValueError):
    """A frame that is not a message the receiver accepts. `request_id` is the id the frame seemed to carry (its
    second element, when that is a string), so the receiver can still fail that one request instead of leaving it
    waiting."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


class Message(msgspec.Struct, array_like=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every message. Subclasses set `tag` (their one-letter kind on the wire)."""


# -- control plane -> worker ----------------------------------------------------------------------------------------


class Submit(Message, tag="S"):
    """Start a generation. Exactly one of `messages` (rendered with the model's chat template in the worker),
    `prompt` (text, tokenized as it is, with the tokenizer's BOS) and `prompt_token_ids` is set. Answered by
    STARTED, then TOKENS..., then FINISHED, or by one ERROR at any point. `max_tokens` 0 only prefills (with
    `prompt_logprobs`, to score the prompt)."""

    request_id: str
    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None  # the log-probability of each prompt token, with this many alternatives
    tools: list[dict[str, Any]] | None = None
    tool_grammar: ToolGrammarMode | None = None  # constrain the calls to `tools` (None: free)
    tool_function: str | None = None  # with tool_grammar "required": the one function that may be called
    enable_thinking: bool | None = None
    reasoning_budget: int | None = None  # think tokens before </think> is forced; None: the load's; 0: unbounded
    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 1024
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0  # stop tokens are refused until this many tokens were generated
    skip_special_tokens: bool = True  # leave the special tokens the model writes out of the text
    session_id: str | None = None  # keep this conversation's KV between turns under that id (ERROR session_capacity)

    def __post_init__(self) -> None:
        if sum(p is not None for p in (self.messages, self.prompt, self.prompt_token_ids)) != 1:
            raise ValueError("exactly one of messages, prompt and prompt_token_ids must be given")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= TOP_LOGPROBS_LIMIT:
            raise ValueError(f"prompt_logprobs must be in [0, {TOP_LOGPROBS_LIMIT}]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")


class Abort(Message, tag="A"):
    """Drop a generation now and free its KV slot. Unknown or finished ids are ignored (abort is idempotent)."""

    request_id: str


class Load(Message, tag="L"):
    """Load a checkpoint under a served name with the operator's options, served within `limits`. Answered by
    LOADED or ERROR (a load reason: checkpoint_not_found, bad_checkpoint, out_of_memory, already_loaded, ...).
    `checkpoint`: `path` is a trainer's saved checkpoint that the weights answer as (its qualified name)."""

    request_id: str
    name: str
    path: str
    options: LoadOptions = LoadOptions()
    limits: ServingLimits = ServingLimits()
    checkpoint: ServedCheckpoint | None = None


class Unload(Message, tag="U"):
    """Stop admitting to a model, let its generations finish for up to `drain_timeout` seconds, then free it.
    Generations still running at the deadline are aborted (each gets ERROR model_unloaded) when `force`; without
    `force` the unload is called off instead (ERROR drain_timeout) and the model serves on. Unloading a model that
    is still loading drops it when its load ends. Answered by UNLOADED or ERROR."""

    request_id: str
    name: str
    drain_timeout: float = 30.0
    force: bool = True


class StatusQuery(Message, tag="?"):
    """Ask for the worker's models, memory and queues. Answered by STATUS."""

    request_id: str


class Pause(Message, tag="P"):
    """Stop admitting new sequences to `model` (None: every model); answered by PAUSED once none is running, at a
    step boundary. Submissions keep queueing meanwhile."""

    request_id: str
    model: str | None = None


class Resume(Message, tag="R"):
    """Undo PAUSE; answered by RESUMED at once."""

    request_id: str
    model: str | None = None


class SessionExport(Message, tag="E"):
    """Serialize a session's most recently used conversation. Answered by SESSION_BLOB, or ERROR
    sessions_disabled, session_not_found or session_busy."""

    request_id: str
    model: str
    session_id: str


class SessionRestore(Message, tag="I"):
    """Install an exported conversation under `session_id`: `blob` as SESSION_BLOB carried it, `tokens` the history
    it covers. Answered by SESSION_RESTORED, or ERROR sessions_disabled, bad_session_blob,
    weights_version_mismatch or session_capacity; a refused restore changes nothing."""

    request_id: str
    model: str
    session_id: str
    blob: bytes
    tokens: list[int]


class SessionRelease(Message, tag="D"):
    """Free every conversation of a session now. Idempotent; answered by SESSION_RELEASED."""

    request_id: str
    model: str
    session_id: str


class SessionWatch(Message, tag="W"):
    """A watch on a session opened (`watching` true) or closed. While one is open the session is never released
    for idleness; after the last closes it is released `watch_grace` seconds later unless a new watch opens.
    Answered by SESSION_WATCHED, or ERROR sessions_disabled."""

    request_id: str
    model: str
    session_id: str
    watching: bool


class SessionList(Message, tag="G"):
    """Ask for a model's sessions. Answered by SESSIONS."""

    request_id: str
    model: str


class WeightsRequest(Message, tag="B"):
    """A call on a model's weights barrier (contract/weights.py). Answered by WEIGHTS_REPLY or WEIGHTS_REFUSED, at
    once or, for a quiesce that drains, a save or a load, when that work ends."""

    request_id: str
    model: str
    call: WeightsCall


class Embed(Message, tag="M"):
    """Embed each input (a text, tokenized as it is with the BOS, or token ids) with the model's pooling. Answered
    by EMBEDDINGS, or ERROR (prompt_too_long for an input over the window, bad_request)."""

    request_id: str
    model: str
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if (self.texts is None) == (self.token_ids is None):
            raise ValueError("exactly one of texts and token_ids must be given")


class Shutdown(Message, tag="X"):
    """Abort everything (each generation gets ERROR shutting_down) and exit the worker loop."""


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
    """A weights call carried out: the route's `data`, and the barrier after it."""

    request_id: str
    data: dict[str, Any]
    snapshot: WeightsSnapshot


class WeightsRefused(Message, tag="n"):
    """A weights call refused: the spec's `code` (NOT_ATTACHED, WEIGHTS_NOT_CLEAN, ...), its `reason` when the spec
    names one (drain_timeout, quiesce_in_progress, gguf, ...), what to tell the caller, and the barrier as it is."""

    request_id: str
    code: str
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
