"""The messages the control plane sends a worker (messages.py: how every message travels, and the replies)."""

from __future__ import annotations

from typing import Any

from inference.engine.contract.dialects.base import ToolGrammarMode
from inference.engine.contract.message_base import Message
from inference.engine.contract.params import (
    TOP_LOGPROBS_LIMIT,
    GenerationOptions,
    LoadOptions,
    Priority,
    SamplingParams,
    ServingLimits,
)
from inference.engine.contract.weights import ServedCheckpoint, WeightsCall


class Submit(Message, tag="S"):
    """Start a generation. Exactly one of `messages` (rendered with the model's chat template in the worker),
    `prompt` (text, tokenized as it is, with the tokenizer's BOS) and `prompt_token_ids` is set. Answered by
    STARTED, then TOKENS..., then FINISHED, or by one ERROR at any point. `options.max_tokens` 0 only prefills
    (with `prompt_logprobs`, to score the prompt). A `priority` "batch" generation yields to interactive ones
    (ServingLimits.batch_slots)."""

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
    options: GenerationOptions = GenerationOptions()  # max_tokens, stop strings and tokens, min_tokens, ...
    session_id: str | None = None  # keep this conversation's KV between turns under that id (ERROR session_capacity)
    # The X-Request-ID of the HTTP request this generation serves, for the worker's log lines about it (None: none)
    http_request_id: str | None = None
    priority: Priority = "interactive"  # "batch": admitted after interactive ones, within the load's batch_slots

    def __post_init__(self) -> None:
        if sum(p is not None for p in (self.messages, self.prompt, self.prompt_token_ids)) != 1:
            raise ValueError("exactly one of messages, prompt and prompt_token_ids must be given")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= TOP_LOGPROBS_LIMIT:
            raise ValueError(f"prompt_logprobs must be in [0, {TOP_LOGPROBS_LIMIT}]")


class Abort(Message, tag="A"):
    """Drop a generation now and free its KV slot. Unknown or finished ids are ignored (abort is idempotent)."""

    request_id: str


class Load(Message, tag="L"):
    """Load a checkpoint under a served name with the operator's options, served within `limits`. Answered by
    LOADED or ERROR (a load reason: checkpoint_not_found, bad_checkpoint, out_of_memory, already_loaded, ...).
    `checkpoint`: `path` is a trainer's saved checkpoint that the weights answer as (its qualified name). `name` is
    the placement's key, every later message's name for the model; `served_name` the name clients use, which a
    model's replicas share ("" : `name`), what its weights answer under and its tool dialect is chosen by."""

    request_id: str
    name: str
    path: str
    options: LoadOptions = LoadOptions()
    limits: ServingLimits = ServingLimits()
    checkpoint: ServedCheckpoint | None = None
    served_name: str = ""


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
    http_request_id: str | None = None  # the HTTP request's X-Request-ID, for the worker's log line about the call

    def __post_init__(self) -> None:
        if (self.texts is None) == (self.token_ids is None):
            raise ValueError("exactly one of texts and token_ids must be given")


class Shutdown(Message, tag="X"):
    """Abort everything (each generation gets ERROR shutting_down) and exit the worker loop."""
