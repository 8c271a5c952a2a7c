"""A model as a worker hosts it: the loaded weights, its scheduler, and the turning of a SUBMIT into a sequence.

Chat templating and tokenization happen here, next to the tokenizer, so the control plane never needs one: it
learns the prompt's token count from STARTED and receives text pieces in TOKENS. Everything a request can be
refused for before it reaches the scheduler (unknown model state aside) is decided here, as one ERROR.
"""

from __future__ import annotations

import time
from typing import Any

from inference.engine.contract import messages as p
from inference.engine.errors import LoadError
from inference.engine.kv_budget import (
    MIN_WINDOW,
    configured_window,
    effective_window,
    element_size,
    free_memory,
    kv_bytes_per_token,
    read_config,
    weight_bytes_estimate,
)
from inference.engine.loaders.loading import LoadedModel, load_model
from inference.engine.sampler import SamplingParams, SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence
from inference.engine.text.chat_template import ChatTemplate, TemplateError
from inference.engine.text.detokenizer import IncrementalDetokenizer

BUSY_RETRY_AFTER = 5.0  # seconds a client refused by a full queue is told to wait
MEMORY_RETRY_AFTER = 5.0  # seconds a client refused under memory pressure is told to wait


class RequestRefused(Exception):
    """A request the worker answers with one ERROR; carries that message."""

    def __init__(self, error: p.Error):
        self.error = error
        super().__init__(error.message)


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


class HostedModel:
    """A loaded model under its served name. `unload` is the UNLOAD it drains for, `deadline` when the drain ends."""

    def __init__(self, name: str, model: LoadedModel, scheduler: Scheduler, *, device: str = "cpu",
                 min_free_memory: int = 0, window_configured: int = 0):  # fmt: skip
        self.name = name
        self.device = device
        self.min_free_memory = min_free_memory  # bytes; below this free, new requests get server_memory_constrained
        self.window_configured = window_configured or scheduler.window
        self.model = model
        self.scheduler = scheduler
        tok = model.tokenizer
        self.template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
        cache = model.runner.cache
        self.kv_bytes = sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values])
        self.unload: p.Unload | None = None
        self.deadline = 0.0

    @classmethod
    def load(cls, req: p.Load, device: str) -> HostedModel:
        """Reads the checkpoint and builds the runner and the scheduler (slow: the worker runs it in a thread).
        The window is the configured one, lowered to what fits in free memory next to the weights (see kv_budget);
        a model that cannot fit even MIN_WINDOW positions fails with MemoryError."""
        slots = max(1, req.max_concurrent)
        config = read_config(req.path)
        if req.max_context > config.max_context:
            raise LoadError(req.path, f"max_context {req.max_context} exceeds the model's {config.max_context}")
        configured = configured_window(config, req.max_context)
        element = element_size(req.dtype, device)
        budget = free_memory(device) - weight_bytes_estimate(config, element) - req.min_free_memory
        window = effective_window(configured, kv_bytes_per_token(config, element), slots, budget)
        if window < min(MIN_WINDOW, configured):
            raise MemoryError(f"{device} has no room for the KV cache of {slots} sequences: {max(0, budget)} bytes "
                              f"left after the weights and the {req.min_free_memory}-byte reserve")  # fmt: skip
        model = load_model(
            req.path, device=device, dtype=req.dtype, quantize=req.quantize, max_slots=slots, max_context=window
        )
        scheduler = Scheduler(
            model.runner,
            model.tokenizer,
            max_concurrent=max(1, req.max_concurrent),
            queue_depth=req.queue_depth,
            queue_timeout=req.queue_timeout,
            prefill_chunk=req.prefill_chunk,
        )
        return cls(req.name, model, scheduler, device=device, min_free_memory=req.min_free_memory,
                   window_configured=configured)  # fmt: skip

    def admit(self, req: p.Submit) -> None:
        """Queues the request's sequence, or raises RequestRefused (bad request, over the window, busy, low memory)."""
        seq = self.sequence_for(req)
        if self.min_free_memory and (free := free_memory(self.device)) < self.min_free_memory:
            raise RequestRefused(
                p.Error(req.request_id, "server_memory_constrained",
                        f"{self.device} has {free} bytes free, below the {self.min_free_memory}-byte reserve", 503,
                        retry_after=MEMORY_RETRY_AFTER)
            )  # fmt: skip
        if self.scheduler.is_full():
            raise RequestRefused(
                p.Error(req.request_id, "server_busy", f"model {req.model!r} is busy; retry shortly", 429,
                        retry_after=BUSY_RETRY_AFTER)
            )  # fmt: skip
        self.scheduler.add(seq)

    def sequence_for(self, req: p.Submit) -> Sequence:
        model, window = self.model, self.scheduler.window
        if req.prompt_token_ids is not None:
            prompt = list(req.prompt_token_ids)
        else:
            try:
                prompt = chat_prompt_ids(
                    model, req.messages or [], template=self.template, tools=req.tools,
                    enable_thinking=req.enable_thinking,
                )  # fmt: skip
            except TemplateError as exc:
                raise invalid(req, str(exc)) from exc
        vocab = model.runner.vocab_size
        if not prompt or any(not 0 <= t < vocab for t in prompt):
            raise invalid(req, f"the prompt must be a non-empty list of token ids below {vocab}")
        if len(prompt) + 1 > window:
            raise RequestRefused(
                p.Error(req.request_id, "context_over_budget",
                        f"the prompt has {len(prompt)} tokens; the context window is {window} (kv_used "
                        f"{len(prompt)}, kv_cap {window})", 422, kv_used=len(prompt), kv_cap=window)
            )  # fmt: skip
        try:
            params = SamplingParams(**req.sampling)
        except TypeError as exc:
            raise invalid(req, f"bad sampling parameters: {exc}") from exc
        stop_ids = set(req.stop_token_ids) | (set() if req.ignore_eos else set(model.eos_token_ids))
        return Sequence(
            req.request_id,
            prompt,
            sampling=SequenceSampling(params, vocab),
            detokenizer=IncrementalDetokenizer(model.tokenizer),
            stop_token_ids=stop_ids,
            stop=req.stop,
            max_tokens=max(1, req.max_tokens),
            max_length=window,
        )

    def loaded(self, req: p.Load, started: float) -> p.Loaded:
        """The LOADED reply to the LOAD that built this model."""
        model, scheduler = self.model, self.scheduler
        return p.Loaded(
            req.request_id, self.name, str(model.path), model.format, model.config.architecture, str(model.device),
            str(model.dtype).removeprefix("torch."), model.weight_bytes, self.kv_bytes, scheduler.window,
            scheduler.max_concurrent, time.monotonic() - started, self.window_configured,
        )  # fmt: skip

    def status(self) -> p.ModelStatus:
        s = self.scheduler
        state = "draining" if self.unload else "paused" if s.paused else "ready"
        return p.ModelStatus(
            self.name, str(self.model.path), state, self.model.weight_bytes, self.kv_bytes, len(s.running),
            s.runner.max_slots, len(s.running), len(s.waiting), s.max_concurrent, s.window,
        )  # fmt: skip


def invalid(req: p.Submit, message: str) -> RequestRefused:
    return RequestRefused(p.Error(req.request_id, "invalid_request_error", message, 400))
