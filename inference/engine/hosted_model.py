"""A model as a worker hosts it: the loaded weights, its scheduler, and the turning of a SUBMIT into a sequence.

Chat templating and tokenization happen here, next to the tokenizer, so the control plane never needs one: it
learns the prompt's token count from STARTED and receives text pieces in TOKENS. A SUBMIT goes through three
checks, each refusing with one ERROR: `check_bound` (cheap, on the worker's loop: a prompt whose text alone is too
long for the context window is refused before it is tokenized), `prepare` (templating and tokenizing; the worker
runs long ones on its preparation thread) and `admit` (memory and queue, on the loop). An EMBED goes the same way:
`check_embed_bound`, `embed_inputs` (tokenizing, on the preparation thread when long), then `embed` on the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import llguidance
import torch

from inference.engine import kernels
from inference.engine.contract import messages as p
from inference.engine.contract.dialects.grammar import tool_call_grammar
from inference.engine.contract.dialects.registry import DIALECT
from inference.engine.contract.markup import THINK_CLOSE, THINK_OPEN
from inference.engine.contract.reasons import Reason
from inference.engine.execution.step_threads import StepThreads
from inference.engine.grammar import GrammarCompiler, GrammarError
from inference.engine.kv.session_blob import SessionSnapshot
from inference.engine.kv_budget import free_memory
from inference.engine.load_plan import load_weights, new_scheduler, plan_load, split
from inference.engine.loaders.loaded import LoadedModel
from inference.engine.loaders.progress import ReadProgress
from inference.engine.sampler import SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence
from inference.engine.serving_metrics import ModelMetrics
from inference.engine.session_calls import SessionCall, answer
from inference.engine.text.chat_template import ChatTemplate, TemplateError
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.text.tool_prompt import choose_dialect, with_decoded_arguments, with_tools_as_text
from inference.engine.think_block import PROMPT_TAIL_TOKENS, ThinkBlock, opens_think

if TYPE_CHECKING:
    from inference.engine.weights.barrier import WeightsBarrier

# Normalization can shrink text (NFKC folds a ligature into fewer bytes), so the cheap bound allows for text that
# shrinks by up to this factor before it refuses a prompt untokenized.
NORMALIZATION_SLACK = 2
# Roles whose content a chat template writes out whole (an assistant turn's may be cut, e.g. its old reasoning).
BOUNDED_ROLES = ("system", "user", "tool")


class RequestRefused(Exception):
    """A request the worker answers with one ERROR; carries that message."""

    def __init__(self, error: p.Error):
        self.error = error
        super().__init__(error.message)


def refusal(request_id: str, reason: Reason, message: str, **data: int) -> RequestRefused:
    return RequestRefused(p.Error(request_id=request_id, reason=reason, message=message, **data))


def chat_prompt_ids(
    model: LoadedModel,
    messages: list[dict[str, Any]],
    *,
    template: ChatTemplate | None = None,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """The prompt token ids a chat request becomes: the model's chat template (ChatML when it has none), then the
    tokenizer, adding BOS only when the tokenizer adds one and the template did not already write it."""
    tok = model.tokenizer
    template = template or ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
    text = template.render(messages, tools=tools, enable_thinking=enable_thinking)
    wrote_bos = bool(tok.bos_token) and text.startswith(tok.bos_token)
    return tok.encode(text, add_special_tokens=not wrote_bos)


def _probe_render(template: ChatTemplate) -> str:
    """A one-turn conversation with thinking on, rendered (empty when the template refuses it): what a model's
    template writes around every prompt (its BOS, an opened think block)."""
    try:
        return template.render([{"role": "user", "content": "hi"}], enable_thinking=True)
    except TemplateError:
        return ""


def prompt_text_length(req: p.Submit) -> int:
    """Characters of a text prompt, or of the chat messages' text that a template writes out whole (see
    BOUNDED_ROLES)."""
    if req.prompt is not None:
        return len(req.prompt)
    texts = (m.get("content") for m in req.messages or () if m.get("role") in BOUNDED_ROLES)
    return sum(len(text) for text in texts if isinstance(text, str))


def compiles_decode(options: p.LoadOptions, device: str) -> bool:
    """Whether a load compiles its decode step: when the operator asks (`compile`), and always on CUDA, where the
    capture costs under a second and an eager step, bound by kernel launches, is several times slower
    (docs/performance.md, "GPU check"); as for the option, a failed capture falls back to eager and says why. Never
    for a split model: its compiled step would leave out the other ranks (docs/tensor-parallel.md)."""
    return (options.compile or torch.device(device).type == "cuda") and not split(options)


class HostedModel:
    """A loaded model under its served name. `unload` is the UNLOAD it drains for, `deadline` when the drain ends."""

    def __init__(
        self,
        name: str,
        model: LoadedModel,
        scheduler: Scheduler,
        *,
        device: str = "cpu",
        min_free_memory: int = 0,
        window_configured: int = 0,
        served_name: str = "",
    ):
        self.name = name  # the placement's key
        self.served_name = served_name or name  # the name clients use (a replica's key differs from it)
        self.device = device
        self.min_free_memory = min_free_memory  # bytes; below this free, new requests are refused (low_memory)
        self.threads: StepThreads | None = None  # what the worker steps it with, once it has chosen
        self.window_configured = window_configured or scheduler.context_window
        self.model = model
        self.scheduler = scheduler
        tok = model.tokenizer
        self.template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
        # A request with tools uses the tokenizer's "tool_use" template when it has one (Hermes-style configs).
        tool_source = tok.chat_templates.get("tool_use")
        self.tool_template = ChatTemplate(tool_source, tok.bos_token, tok.eos_token) if tool_source else self.template
        probe = _probe_render(self.template)
        self.tool_dialect = choose_dialect(
            self.tool_template.source,
            name=self.served_name,
            architecture=model.config.architecture,
            template_writes_bos=bool(tok.bos_token) and probe.startswith(tok.bos_token),
        )
        self.tool_tokens = frozenset(m for m in DIALECT[self.tool_dialect].single_tokens if tok.is_added_token(m))
        self.think_in_prompt = opens_think(probe)
        # The token that opens a think block, when the tokenizer has one: a constrained answer may start with it.
        self.think_open_id = tok.backend.token_to_id(THINK_OPEN) if tok.is_added_token(THINK_OPEN) else None
        self.grammars = GrammarCompiler(tok, model.runner.vocab_size)
        self.reasoning_budget = 0  # the load's default for requests that name none (0: unbounded)
        self.pooling = "mean"  # how embeddings pool the final hidden states (LoadOptions.pooling)
        self.think_close_ids = tok.encode(f"\n{THINK_CLOSE}\n\n", add_special_tokens=False)
        # A prompt with more characters than this cannot fit the window, whatever its tokens (see check_bound).
        self.max_prompt_chars = scheduler.context_window * tok.max_token_bytes * NORMALIZATION_SLACK
        cache = model.runner.cache
        pool_bytes = sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values])
        self.prefix_cache_bytes = pool_bytes * model.runner.cache_blocks // (cache.pool.num_blocks + 1)
        self.kv_bytes = pool_bytes - self.prefix_cache_bytes  # the sequences' windows (and the scratch block)

        self.unload: p.Unload | None = None
        self.deadline = 0.0
        self.barrier: WeightsBarrier | None = None  # the worker sets it once the model is loaded

    @classmethod
    def load(
        cls,
        req: p.Load,
        device: str,
        progress: ReadProgress | None = None,
        step_threads: Callable[[LoadedModel], StepThreads | None] | None = None,
    ) -> HostedModel:
        """Reads the checkpoint and builds the runner and the scheduler (slow: the worker runs it in a thread, and
        reports `progress`, which the read counts, while it runs). With the `compile` option (always on CUDA) the
        decode step is compiled (CPU, here) or captured (CUDA, by the worker's loop: `warm_up_next`) for every
        batch-size bucket before the load answers, for the intra-op threads `step_threads` gives the model (the
        worker's choice when it steps it).
        The window and the KV pool are planned first (load_plan.py: a model that cannot fit fails with MemoryError
        before any weight is read)."""
        options, limits = req.options, req.limits
        plan = plan_load(req, device)
        model = load_weights(req, plan, device, progress)
        try:
            if compiles_decode(options, device):
                threads = step_threads(model) if step_threads else None
                # A CUDA capture is left to the worker's loop, between its steps (`warm_up_next`): beside the loop's
                # launches for other models it would fail them and itself. A CPU compile takes seconds per bucket,
                # too long to hold the loop; it runs here, and the kernels' pool takes one job at a time.
                cuda = torch.device(device).type == "cuda"
                model.runner.compile_decode(threads=threads.torch if threads else None, now=not cuda)
            scheduler = new_scheduler(model, limits, ModelMetrics(req.name))
            hosted = cls(req.name, model, scheduler, device=device, min_free_memory=limits.min_free_memory,
                         window_configured=plan.configured, served_name=req.served_name)  # fmt: skip
        except BaseException:
            if model.split is not None:  # the follower ranks go with the load that failed
                model.split.close()
            raise
        hosted.reasoning_budget = options.reasoning_budget
        hosted.pooling = options.pooling
        return hosted

    def close(self) -> None:
        """Ends what the model holds outside this process: a split model's follower ranks. The worker calls it when
        the model is unloaded, dropped or the worker stops."""
        if self.model.split is not None:
            self.model.split.close()

    def warm_up_next(self) -> bool:
        """Captures the next bucket of a decode step the load left to the loop (CUDA); whether any remain after it.
        The worker calls it between steps, before the model serves."""
        return self.model.runner.warm_up_next()

    def check_bound(self, req: p.Submit) -> None:
        """Refuses (prompt_too_long) a prompt that cannot fit the window, judged without tokenizing it: by its token
        count, or for a text prompt and chat messages by their text's length (see `least_tokens`)."""
        if req.prompt_token_ids is not None:
            least = len(req.prompt_token_ids)
        else:
            least = self.least_tokens(prompt_text_length(req))
        if least + 1 > self.scheduler.context_window:  # one position is left for the first generated token
            raise self._over_window(req.request_id, least, "the prompt has at least")

    def check_embed_bound(self, req: p.Embed) -> None:
        """Refuses (prompt_too_long) an EMBED one of whose inputs cannot fit the window, judged as `check_bound` does
        without tokenizing anything: each token-id list by its length, each text by its length."""
        if req.token_ids is not None:
            least = max(map(len, req.token_ids), default=0)
        else:
            least = self.least_tokens(max(map(len, req.texts), default=0))
        if least > self.scheduler.context_window:
            raise self._over_window(req.request_id, least, "an input has at least")

    def least_tokens(self, chars: int) -> int:
        """The fewest tokens a text of `chars` characters may become (a token stands for at most `max_token_bytes`
        bytes); 0, as good as unknown, for a text short enough to fit the window whatever its tokens."""
        if chars <= self.max_prompt_chars:
            return 0
        return chars // (self.model.tokenizer.max_token_bytes * NORMALIZATION_SLACK)

    def _over_window(self, request_id: str, tokens: int, what: str) -> RequestRefused:
        window = self.scheduler.context_window
        message = f"{what} {tokens} tokens; the context window is {window} (kv_used {tokens}, kv_cap {window})"
        return refusal(request_id, Reason.PROMPT_TOO_LONG, message, kv_used=tokens, kv_cap=window)

    def prepare(self, req: p.Submit) -> Sequence:
        """The request's sequence: templated, tokenized and checked against the window (the slow part of a
        SUBMIT; thread-safe, touches no scheduler state). Raises RequestRefused."""
        model, window = self.model, self.scheduler.context_window
        if req.prompt_token_ids is not None:
            prompt = list(req.prompt_token_ids)
        elif req.prompt is not None:
            prompt = model.tokenizer.encode(req.prompt, add_special_tokens=True)
        else:
            try:
                prompt = self._chat_prompt(req)
            except TemplateError as exc:
                raise refusal(req.request_id, Reason.BAD_REQUEST, str(exc)) from exc
        vocab = model.runner.vocab_size
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise refusal(req.request_id, Reason.BAD_REQUEST, f"the prompt must be non-empty token ids below {vocab}")
        if len(prompt) + 1 > window:
            raise self._over_window(req.request_id, len(prompt), "the prompt has")
        grammar = None
        if (grammar_text := self._grammar_text(req)) is not None:
            try:
                grammar = self.grammars.matcher(grammar_text)
            except GrammarError as exc:
                raise refusal(req.request_id, Reason.BAD_REQUEST, f"the grammar does not compile: {exc}") from exc
        seq = Sequence(
            req.request_id,
            prompt,
            sampling=SequenceSampling(req.sampling, vocab, grammar),
            detokenizer=IncrementalDetokenizer(model.tokenizer, skip_special_tokens=req.options.skip_special_tokens),
            options=req.options,
            eos_token_ids=model.eos_token_ids,
            prompt_logprobs=req.prompt_logprobs,
            context_window=window,
            session_id=req.session_id,
            priority=req.priority,
        )
        if req.messages is not None:
            tail = model.tokenizer.decode(prompt[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
            budget = self.reasoning_budget if req.reasoning_budget is None else req.reasoning_budget
            seq.think = ThinkBlock(opened=opens_think(tail), budget=budget, close_ids=self.think_close_ids)
            if grammar is not None and seq.think.state == "open":  # the grammar is for the answer, after the block
                seq.defer_grammar()
            elif grammar is not None and req.enable_thinking and self.think_open_id is not None:
                # thinking asked for: the output may open the block itself before the grammar's answer
                seq.sampling.grammar_exempt = self.think_open_id
        return seq

    def _chat_prompt(self, req: p.Submit) -> list[int]:
        """The prompt of a chat SUBMIT: with tools, the tool template renders them if it reads `tools`, else they
        and the conversation's calls are written as text in the model's dialect (tool_prompt.py)."""
        messages, tools, template = req.messages, req.tools, self.template
        if any(m.get("tool_calls") or m.get("role") == "tool" for m in messages) or tools:
            template = self.tool_template
            if template.reads_tools:
                messages = with_decoded_arguments(messages)
            else:
                messages, tools = with_tools_as_text(messages, tools, self.tool_dialect), None
        thinking = req.enable_thinking
        return chat_prompt_ids(self.model, messages, template=template, tools=tools, enable_thinking=thinking)

    def _grammar_text(self, req: p.Submit) -> str | None:
        """The llguidance grammar a SUBMIT's output must follow: its tool-call grammar, else its response_format's."""
        if req.tool_grammar is None or not req.tools:
            return req.sampling.grammar
        lark = tool_call_grammar(
            self.tool_dialect,
            req.tools,
            mode=req.tool_grammar,
            function=req.tool_function,
            single_tokens=self.tool_tokens,
        )
        return None if lark is None else llguidance.LLMatcher.grammar_from_lark(lark)

    def embed_inputs(self, req: p.Embed) -> list[list[int]]:
        """An EMBED's inputs as token ids: tokenized and checked (the slow part of an EMBED, like `prepare`;
        thread-safe). Raises RequestRefused for an input that is empty, holds ids outside the vocabulary, or does
        not fit the window."""
        tok, window, vocab = self.model.tokenizer, self.scheduler.context_window, self.model.runner.vocab_size
        inputs = req.token_ids or [tok.encode(text, add_special_tokens=True) for text in req.texts]
        for ids in inputs:
            if len(ids) > window:
                raise self._over_window(req.request_id, len(ids), "an input has")
            if not ids or any(not 0 <= t < vocab for t in ids):
                raise refusal(
                    req.request_id, Reason.BAD_REQUEST, f"each input must be non-empty token ids below {vocab}"
                )
        return inputs

    def embed(self, req: p.Embed, inputs: list[list[int]]) -> p.Embeddings:
        """The embeddings of an EMBED's `inputs` (from `embed_inputs`): one forward pass per `max_concurrent` of
        them, on the worker's loop between steps (generations go on around it)."""
        runner = self.model.runner
        group = runner.max_concurrent  # inputs per pass: the KV pool always has room for that many full windows
        batches = [runner.embed(inputs[i : i + group], self.pooling) for i in range(0, len(inputs), group)]
        vectors = [row.numpy().astype("<f4").tobytes() for batch in batches for row in batch]
        return p.Embeddings(request_id=req.request_id, vectors=vectors, prompt_tokens=[len(ids) for ids in inputs])

    def admit(self, seq: Sequence) -> None:
        """Queues a prepared sequence, or raises RequestRefused (low memory, queue full, a new session id while
        every session place is taken)."""
        if self.min_free_memory and (free := free_memory(self.device)) < self.min_free_memory:
            message = f"{self.device} has {free} bytes free, below the {self.min_free_memory}-byte reserve"
            raise refusal(seq.request_id, Reason.LOW_MEMORY, message)
        if self.scheduler.is_full(seq.priority):
            line = "its batch line is full" if seq.priority == "batch" else "busy"
            raise refusal(seq.request_id, Reason.QUEUE_FULL, f"model {self.name!r} is {line}; retry shortly")
        sessions = self.scheduler.sessions
        if seq.session_id is not None and sessions is not None:
            seq.session = sessions.claim(seq.session_id)
            if seq.session is None:
                raise refusal(seq.request_id, Reason.SESSION_CAPACITY, self._capacity_message(len(seq.prompt_ids)))
        self.scheduler.add(seq)

    def _capacity_message(self, prompt_tokens: int) -> str:
        """Why a new session id is refused, with what re-prefilling this prompt without a session would take."""
        rate = self.scheduler.prefill_tok_per_s
        estimate = f"about {prompt_tokens / rate:.1f} s at the measured {rate:.0f} tok/s" if rate else "unmeasured yet"
        return (
            f"all {self.scheduler.sessions.max_sessions} session places of model {self.name!r} hold a live session; "
            f"retry later, release a session, or send the request without a session id (re-prefilling its "
            f"{prompt_tokens} prompt tokens: {estimate})"
        )

    def loaded(self, req: p.Load, started: float) -> p.Loaded:
        """The LOADED reply to the LOAD that built this model."""
        model, scheduler = self.model, self.scheduler
        return p.Loaded(
            request_id=req.request_id,
            name=self.name,
            path=str(model.path),
            format=model.format,
            architecture=model.config.architecture,
            device=str(model.device),
            dtype=str(model.dtype).removeprefix("torch."),
            weight_bytes=model.weight_bytes,
            kv_bytes=self.kv_bytes,
            kv_dtype=str(model.runner.cache.keys[0].dtype).removeprefix("torch."),
            context_window=scheduler.context_window,
            context_window_configured=self.window_configured,
            max_concurrent=scheduler.max_concurrent,
            load_seconds=time.monotonic() - started,
            weights_version=model.weights_version,
            tool_dialect=self.tool_dialect,
            thinks_before_grammar=self.think_in_prompt or self.think_open_id is not None,
            weights=self.barrier.snapshot(),
            linear_formats=model.linear_formats,
            graphs=self.decode_graphs(),
            prefix_cache_bytes=self.prefix_cache_bytes,
            kernels=kernels.active_kernels(),
            tensor_parallel=model.split.report() if model.split is not None else None,
            attention=model.runner.attention,
        )

    def record_occupancy(self) -> None:
        """Sets this model's occupancy gauges (queue, batch, KV blocks, sessions) from its scheduler and pool."""
        s, pool = self.scheduler, self.model.runner.cache.pool
        if s.metrics is not None:
            sessions = len(s.sessions.sessions) if s.sessions else 0
            s.metrics.occupancy(waiting=s.num_waiting(), decoding=len(s.running), blocks_used=pool.num_used,
                                blocks_free=pool.num_free, sessions=sessions)  # fmt: skip

    def status(self) -> p.ModelStatus:
        s = self.scheduler
        cache = self.model.runner.cache
        pool, host = cache.pool, cache.host
        return p.ModelStatus(
            name=self.name,
            path=str(self.model.path),
            state="draining" if self.unload else "paused" if s.paused else "ready",
            weight_bytes=self.model.weight_bytes,
            kv_bytes=self.kv_bytes,
            slots_used=len(s.running),
            slots_total=s.runner.max_concurrent,
            running=len(s.running),
            waiting=s.num_waiting(),
            max_concurrent=s.max_concurrent,
            context_window=s.context_window,
            blocks_total=pool.num_blocks,
            blocks_free=pool.num_free,
            blocks_cached=pool.num_cached,
            blocks_pinned=s.sessions.pinned_blocks() if s.sessions else 0,
            block_size=pool.block_size,
            sessions=len(s.sessions.sessions) if s.sessions else 0,
            prefill_tok_per_s=s.prefill_tok_per_s,
            graphs=self.decode_graphs(),
            prefix_cache_bytes=self.prefix_cache_bytes,
            prefix_lookup_tokens=cache.lookup_tokens,
            prefix_hit_tokens=cache.hit_tokens,
            host_offloaded_blocks=host.offloaded if host else 0,
            host_restored_blocks=host.restored if host else 0,
            host_bytes=host.bytes_used if host else 0,
            batch_running=s.batch_running(),
            batch_waiting=len(s.queues["batch"]),
            batch_slots=s.batch_slots,
        )

    def decode_graphs(self) -> p.DecodeGraphs:
        """How the decode step runs now: compiled or captured per bucket, or eager (and why, if it fell back)."""
        graphs = self.model.runner.graphs
        if graphs is None:
            return p.DecodeGraphs()
        return p.DecodeGraphs(
            mode=graphs.mode,
            buckets=list(graphs.buckets),
            warmup_ms=round(graphs.warmup_ms, 1),
            fallback_reason=graphs.fallback_reason,
        )

    def answer_session_call(self, call: SessionCall, restored: SessionSnapshot | p.Error | None = None) -> p.Message:
        """Answers after `settle()`: a turn whose FINISHED went out is no longer in flight (not session_busy).
        `restored`: a restore's blob, read already (session_calls.read_restore)."""
        self.scheduler.settle()
        return answer(self.model, self.scheduler.sessions, call, restored)
