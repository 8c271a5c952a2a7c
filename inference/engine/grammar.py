"""Constrained decoding: which tokens a sequence may sample next, from a grammar, with llguidance.

A request's grammar arrives as llguidance's grammar JSON (the API edge builds it from `response_format`; see
inference/api/response_format.py). Each model keeps one `GrammarCompiler`: llguidance's view of the model's
tokenizer (built on first use; it walks the whole vocabulary) and the matchers compiled so far, by grammar text, so
a schema that many requests share is compiled once and each request gets a copy in its start state.

A constrained sequence carries its matcher in its `SequenceSampling`. Each step the sampler asks every constrained
row of the batch for its token bitmask and sets the logits of disallowed tokens to -inf before drawing, so
constrained and free rows share one batch (`allowed_only`); the drawn token is then fed to the matcher. When the
grammar is complete the only token it allows is EOS, which ends the sequence as any stop token does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance
import llguidance.numpy as llg_numpy
import torch

from inference.engine.text.tokenizer import Tokenizer

COMPILED_GRAMMARS_KEPT = 64  # distinct grammars kept compiled per model (least recently used go first)


class GrammarError(ValueError):
    """A grammar llguidance cannot compile (the message says why)."""


class GrammarCompiler:
    """Compiles grammars for one model's tokenizer and vocabulary width (the logits' width, which may exceed the
    tokenizer's own count). Thread-safe: the worker prepares large requests on threads of their own, and a compiled
    matcher must not be copied by two threads at once (llguidance raises)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._llg_tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A matcher for `grammar` in its start state, or GrammarError."""
        with self._lock:
            return self._start_state(grammar)

    def _start_state(self, grammar: str) -> llguidance.LLMatcher:
        compiled = self._compiled.get(grammar)
        if compiled is None:
            compiled = llguidance.LLMatcher(self._tokenizer_view(), grammar)
            if compiled.is_error():
                raise GrammarError(compiled.get_error())
            self._compiled[grammar] = compiled
            if len(self._compiled) > COMPILED_GRAMMARS_KEPT:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return compiled.deep_copy()

    def _tokenizer_view(self) -> llguidance.LLTokenizer:
        if self._llg_tokenizer is None:
            tokenizer = self._tokenizer
            self._llg_tokenizer = llguidance.LLTokenizer(
                tokenizer.backend.to_str(), n_vocab=self._vocab_size, eos_token=tokenizer.eos_token_id
            )
        return self._llg_tokenizer


def allowed_only(
    scores: torch.Tensor, rows: list[int], matchers: list[llguidance.LLMatcher], exempt: list[int | None]
) -> torch.Tensor:
    """scores: [B, V] -> the same with every token that `matchers[i]` does not allow next set to -inf in row
    `rows[i]` (in place), except `exempt[i]` (None: none), which keeps its score.

    The bitmask is filled through llguidance's numpy helpers and unpacked here: its torch module applies the mask
    with torch.compile, and importing it loads the compiler stack (resident memory in every worker, and
    seconds of start-up) on hosts that never compile; its first call takes seconds on a CPU and needs a C++
    compiler."""
    vocab = scores.shape[1]
    words = llg_numpy.allocate_token_bitmask(len(rows), vocab)  # [R, ceil(V / 32)] int32, bit j of word w: 32w + j
    for i, matcher in enumerate(matchers):
        llg_numpy.fill_next_token_bitmask(matcher, words, i)
    bitmask = torch.from_numpy(words)
    bits = (bitmask.to(scores.device).unsqueeze(-1) >> _bit_positions(scores.device)) & 1  # [R, W, 32]
    allowed = bits.flatten(1)[:, :vocab].bool()
    for i, token in enumerate(exempt):
        if token is not None:
            allowed[i, token] = True
    scores[rows] = scores[rows].masked_fill(~allowed, float("-inf"))
    return scores


def _bit_positions(device: torch.device) -> torch.Tensor:
    return torch.arange(32, dtype=torch.int32, device=device)
