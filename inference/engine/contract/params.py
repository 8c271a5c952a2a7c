"""The parameters that cross the process boundary: how to sample a generation and when it ends, and how to load and
serve a model.

Torch-free and Django-free (msgspec only), so the control plane builds these and the worker receives the very same
types. Each checks its invariants in `__post_init__`, which msgspec runs both when code builds one and when the
worker decodes one from a message, so a bad value fails the one request that carries it, before it can reach a
batched engine step.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from inference.engine.contract.weights import WeightsTimers

SEED_LIMIT = 2**63  # seeds are non-negative 63-bit integers (the sampler's counter-based draws)
TOP_LOGPROBS_LIMIT = 20
TOKEN_ID_LIMIT = 2**31 - 1  # no vocabulary comes near it; bounds what may travel as a token id or a top_k

# Whom a generation serves: a client waiting on it ("interactive"), or a batch's line (the Batch API's runner sends
# X-Pantheon-Priority: batch), which the scheduler admits after interactive ones and within `batch_slots`.
Priority = Literal["interactive", "batch"]


class SamplingParams(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """One generation's sampling knobs, as the API edge validated and clamped them. temperature <= 0 is greedy;
    top_k 0 is off; a request without a seed gets a random one in the worker."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None  # token id -> bias; -100 or less bans the token
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token, only when logprobs is set
    grammar: str | None = None  # an llguidance grammar (JSON) the output must follow, from response_format

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        if not 0.0 <= self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0:
            raise ValueError("top_p and min_p must be in [0, 1]")
        if not 0 <= self.top_k <= TOKEN_ID_LIMIT:
            raise ValueError(f"top_k must be in [0, {TOKEN_ID_LIMIT}] (0: off)")
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if not 0 <= self.top_logprobs <= TOP_LOGPROBS_LIMIT:
            raise ValueError(f"top_logprobs must be in [0, {TOP_LOGPROBS_LIMIT}]")
        if self.logit_bias and not all(math.isfinite(b) for b in self.logit_bias.values()):
            raise ValueError("logit_bias values must be finite numbers")
        if self.logit_bias and not all(abs(t) <= TOKEN_ID_LIMIT for t in self.logit_bias):
            raise ValueError(f"logit_bias keys must be token ids of at most {TOKEN_ID_LIMIT}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class GenerationOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What ends one generation and how its text is written, as the API edge resolved them: at most `max_tokens`
    tokens (0 only prefills, to score the prompt); the `stop` strings and `stop_token_ids` end it, and the model's
    end-of-sequence tokens too unless `ignore_eos`; none of these may end it before `min_tokens` tokens; the special
    tokens the model writes are left out of the text when `skip_special_tokens`. Carried whole from the edge's
    request to the worker's `Sequence`."""

    max_tokens: int = 1024
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")


# A tensor dtype a load may ask for, by torch's name; empty: chosen automatically (LoadOptions says how, per field).
DtypeName = Literal["", "float32", "bfloat16", "float16"]


class LoadOptions(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """What an operator may ask of a load: the one schema behind the load route's body, the catalogue's defaults,
    `manage.py load_model`'s flags and the worker's LOAD. 0 means the default (for reasoning_budget: unbounded);
    an empty dtype is automatic (float32 on CPU, bfloat16 on CUDA). The route's fields, the command's flags and
    their help are read from these fields and their descriptions, so a new option is added here alone."""

    ctx_cap: Annotated[int, Meta(description="the context window in tokens (0: the model's own, capped at 4096)")] = 0
    max_sessions: Annotated[int, Meta(description="sessions that may keep KV between turns")] = 0
    max_concurrent: Annotated[int, Meta(description="sequences decoded together (0: max_sessions or the default)")] = 0
    reasoning_budget: Annotated[int, Meta(description="think tokens before </think> is forced (0: unbounded)")] = 0
    quantize: Annotated[bool, Meta(description="int8-quantize the linear layers at load")] = False
    dtype: Annotated[
        DtypeName,
        Meta(
            description="the weights' dtype (empty: float32 on CPU, where a GGUF file's quantized layers stay "
            "quantized, and bfloat16 on CUDA; float32 expands them exactly)"
        ),
    ] = ""
    kv_dtype: Annotated[
        DtypeName,
        Meta(
            description="the KV cache's dtype (empty: the weights', or float16 for a GGUF file whose quantized "
            "layers stay quantized); 16 bits hold twice the tokens in the same memory and halve what a decode step "
            "reads, at a small cost in exactness (docs/kv-cache.md)"
        ),
    ] = ""
    host_cache_mb: Annotated[
        int,
        Meta(
            description="MiB of host memory (pinned on CUDA) for a second tier of the prefix cache: cached blocks the "
            "KV pool takes back move there and come back on a prefix hit instead of being prefilled again (0: off; "
            "not with tensor_parallel; docs/kv-cache.md)"
        ),
    ] = 0
    pooling: Annotated[
        Literal["mean", "last"],
        Meta(description="how /v1/embeddings pools the final hidden states: their mean, or the last token's"),
    ] = "mean"
    compile: Annotated[
        bool,
        Meta(
            description="compile the decode step at load, a graph per batch-size bucket: faster steps for small "
            "models, tens of seconds more load on a CPU (docs/performance.md); on CUDA the step is always captured "
            "as CUDA graphs, whatever this says"
        ),
    ] = False
    tensor_parallel: Annotated[
        int,
        Meta(
            description="the ranks the model is split across (its heads and feed-forward rows), each a process with "
            "its own share of the weights and KV: CPU processes over gloo, or CUDA devices from the load's on, over "
            "NCCL (0 or 1: not split; docs/tensor-parallel.md)"
        ),
    ] = 1
    attention: Annotated[
        Literal["", "gather", "flex"],
        Meta(
            description="how attention reads the paged KV cache: gather copies each sequence's blocks before "
            "attending, flex reads them in place, every sequence of a step in one call (empty: gather; not with "
            "tensor_parallel; docs/attention.md)"
        ),
    ] = ""

    def __post_init__(self) -> None:
        for name in (
            "ctx_cap",
            "max_sessions",
            "max_concurrent",
            "reasoning_budget",
            "host_cache_mb",
            "tensor_parallel",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (the default) or positive")


class ServingLimits(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How a worker's scheduler serves one model: the platform's settings, resolved by the control plane.

    `max_concurrent` sequences decode together; `queue_depth` more may wait for a slot (0: a busy model refuses at
    once) for up to `queue_timeout` seconds; prompts are prefilled `prefill_chunk` tokens per step; below
    `min_free_memory` bytes of free device memory new generations are refused (0: never). Batch-priority sequences
    hold at most `batch_slots` of the slots, are admitted only when no interactive one waits, and wait in a line of
    their own (`queue_depth` places, no queue_timeout; scheduler.py).

    The KV cache is a pool of `block_size`-position blocks: room for `max_concurrent` sequences at the full context
    window, and `prefix_cache_bytes` more for the prefix cache, as memory allows (None: an automatic share of the
    free memory, kv_budget.prefix_cache_bytes; 0: no more than the windows). `max_sessions` session ids may keep KV
    between turns (0: sessions are off, the session routes answer session_caching_disabled); an idle one is released
    after `session_idle_ttl` seconds, a watched one `watch_grace` seconds after its last watch closed.

    A decode whose last `repetition_span` tokens repeat one period at least four times is ended with finish_reason
    "repetition_loop" (0: never; repetition.py).

    `attachable`: load the weights so that a trainer can attach to them (engine/weights/; the control plane sets it
    when a trainer token exists at load time), run under the barrier's `weights_timers`."""

    max_concurrent: int = 1
    batch_slots: int = 1  # of max_concurrent, the slots batch-priority sequences may hold at once
    queue_depth: int = 0
    queue_timeout: float = 30.0
    prefill_chunk: int = 128
    min_free_memory: int = 0
    block_size: int = 16
    prefix_cache_bytes: int | None = 0
    max_sessions: int = 0
    session_idle_ttl: float = 12 * 3600.0
    watch_grace: float = 45.0
    repetition_span: int = 0
    attachable: bool = False
    weights_timers: WeightsTimers = WeightsTimers()

    def __post_init__(self) -> None:
        if self.max_concurrent < 1 or self.prefill_chunk < 1 or self.block_size < 1:
            raise ValueError("max_concurrent, prefill_chunk and block_size must be positive")
        if not 1 <= self.batch_slots <= self.max_concurrent:
            raise ValueError("batch_slots must be in [1, max_concurrent]")
        if self.queue_depth < 0 or self.min_free_memory < 0 or not self.queue_timeout >= 0:
            raise ValueError("queue_depth, queue_timeout and min_free_memory must not be negative")
        if (self.prefix_cache_bytes or 0) < 0 or self.max_sessions < 0:
            raise ValueError("prefix_cache_bytes and max_sessions must not be negative")
        if not self.session_idle_ttl >= 0 or not self.watch_grace >= 0:
            raise ValueError("session_idle_ttl and watch_grace must not be negative")
        if self.repetition_span < 0:
            raise ValueError("repetition_span must be 0 (off) or positive")
