"""Turn a batch of next-token logits into one token per sequence, each row with its own sampling parameters.

The scheduler keeps a `SequenceSampling` per running sequence and calls `sample_batch(logits, states)` once
per step for the whole batch. Per-row parameters are gathered into a few small tensors per call; all work
over the vocabulary is batched tensor code (see `token_draw`), and a batch of greedy rows is one max().

Semantics, row by row:
1. logit adjustments: `logit_bias` plus OpenAI's penalties over the tokens *generated so far*
   (`logit[j] -= count[j] * frequency_penalty + (count[j] > 0) * presence_penalty`). A bias of -100 or
   less is a hard ban (the token can never be chosen, whatever the temperature).
2. temperature <= 0: greedy argmax of the adjusted logits.
3. otherwise divide by temperature, keep top_k, then top_p, then min_p (transformers' order), and draw.
Before 2. and 3., a row with a grammar (grammar.py) has every token its grammar does not allow next set to -inf,
and a row with a `forced_token` (the close of a think block past its budget, think_block.py) can draw only that.
Reported logprobs are log_softmax of the *raw* logits, before adjustments, grammar and temperature: they say what
the model itself thought of the token, so they do not change with a request's sampling knobs.

Seeds: a row's randomness is a pure function of (seed, step) (`counter_uniform`), so the same request gives
the same tokens whether it runs alone or batched with others. Requests without a seed get a random one.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat

import llguidance
import torch

from inference.engine.contract.params import SamplingParams
from inference.engine.grammar import allowed_only
from inference.engine.token_draw import HEAD_LIMIT, DrawParams, draw_from_head, draw_from_vocab

BAN_BIAS = -100.0  # a logit_bias at or below this bans the token outright

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64(z: int) -> int:
    """SplitMix64's output function: a bijective avalanche on 64-bit integers (Python ints: no overflow)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def counter_uniform(seed: int, step: int) -> float:
    """A uniform number in (0, 1) that is a pure function of (seed, step).

    Counter-based rather than a generator: nothing to carry between steps, and a row draws the same numbers
    whatever else shares its batch. seed and seed + 1 (the spec's n > 1 choices) give unrelated streams.
    """
    key = _mix64((seed * _GOLDEN64) & _MASK64)
    z = _mix64((key + (step + 1) * _GOLDEN64) & _MASK64)
    return ((z >> 40) + 0.5) / (1 << 24)


class SequenceSampling:
    """A running sequence's sampling state: its parameters, seed, step counter and generated-token counts.

    `logit_adjustments` holds, per token, what is added to its logit (bias minus penalties); it is kept up to
    date by `record`, so a sampling call only has to gather it. `sample_batch` records the tokens it draws;
    a caller that forces a token some other way records it with `record` too. `grammar`, when set, is the
    llguidance matcher that limits what the row may sample; `record` advances it. `grammar_exempt`, when set, is one
    token the row may draw as its first instead of what the grammar allows, unseen by the grammar (the `<think>` that
    opens a think block before a constrained answer). `forced_token`, when set (by the scheduler, before a step), is
    the only token the row may draw.
    """

    __slots__ = (
        "params",
        "seed",
        "step",
        "token_counts",
        "logit_adjustments",
        "grammar",
        "grammar_exempt",
        "forced_token",
        "_bias",
        "_penalized",
    )

    def __init__(self, params: SamplingParams, vocab_size: int, grammar: llguidance.LLMatcher | None = None) -> None:
        self.params = params
        self.grammar = grammar
        self.grammar_exempt: int | None = None
        self.forced_token: int | None = None
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.step = 0
        self.token_counts: dict[int, int] = {}
        # Token ids outside the model's vocabulary cannot be sampled anyway; their bias is dropped.
        self._bias = {
            token: (-math.inf if bias <= BAN_BIAS else bias)
            for token, bias in (params.logit_bias or {}).items()
            if 0 <= token < vocab_size and bias != 0
        }
        self.logit_adjustments: dict[int, float] = dict(self._bias)
        self._penalized = params.presence_penalty != 0 or params.frequency_penalty != 0

    def uniform(self) -> float:
        """This step's random number in (0, 1)."""
        return counter_uniform(self.seed, self.step)

    def record(self, token_id: int) -> None:
        """Account for one generated token: advance the step, update its penalty and the grammar's state."""
        self.step += 1
        exempt, self.grammar_exempt = self.grammar_exempt, None  # only ever for the first token
        if self.grammar is not None and token_id != exempt:
            self.grammar.consume_token(token_id)
        self.token_counts[token_id] = self.token_counts.get(token_id, 0) + 1
        if self._penalized:
            self.logit_adjustments[token_id] = self._adjustment(token_id)

    def refuse(self, token_ids: Iterable[int]) -> None:
        """Bans `token_ids` until `allow` lifts the ban (stop tokens, while a turn may not end yet)."""
        for token_id in token_ids:
            self.logit_adjustments[token_id] = -math.inf

    def allow(self, token_ids: Iterable[int]) -> None:
        """Lifts `refuse`: the tokens get their bias and penalties back."""
        for token_id in token_ids:
            if adjustment := self._adjustment(token_id):
                self.logit_adjustments[token_id] = adjustment
            else:
                self.logit_adjustments.pop(token_id, None)

    def _adjustment(self, token_id: int) -> float:
        """What is added to a token's logit: its bias minus its penalties for the times it was generated."""
        count = self.token_counts.get(token_id, 0)
        penalty = count * self.params.frequency_penalty + self.params.presence_penalty if count else 0.0
        return self._bias.get(token_id, 0.0) - penalty


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities reported for one sampled token."""

    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first; `top_logprobs` entries


@dataclass(slots=True)
class SampledTokens:
    """One step's result: a token per row, and logprobs for the rows that asked for them (else None)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def sample_batch(logits: torch.Tensor, states: Sequence[SequenceSampling]) -> SampledTokens:
    """Sample one token per row and record it in that row's state.

    logits: [B, V] (any float dtype, any device); states: B sequence states, row i belongs to states[i].
    Rows are grouped by how they sample (greedy, small top_k, whole vocabulary); each group is one batch of
    tensor operations, and no row's result depends on which group-mates it has.
    """
    raw = logits.float()
    scores = _adjusted(raw, states)
    if constrained := [row for row, state in enumerate(states) if state.grammar is not None]:
        exempt = [states[r].grammar_exempt for r in constrained]
        scores = allowed_only(
            scores if scores is not raw else raw.clone(), constrained, [states[r].grammar for r in constrained], exempt
        )
    if forced := [row for row, state in enumerate(states) if state.forced_token is not None]:
        scores = _only_forced(scores if scores is not raw else raw.clone(), forced, states)
    groups: dict[str, list[int]] = {"greedy": [], "head": [], "vocab": []}
    for row, state in enumerate(states):
        groups[_group_of(state.params, scores.shape[1])].append(row)
    groups = {kind: rows for kind, rows in groups.items() if rows}
    if len(groups) == 1:
        [(kind, rows)] = groups.items()
        tokens = _draw_group(kind, scores, rows, states)
    else:
        tokens = torch.empty(len(states), dtype=torch.long, device=scores.device)
        for kind, rows in groups.items():
            tokens[rows] = _draw_group(kind, scores[rows], rows, states)
    token_ids = tokens.tolist()
    logprobs = _logprobs(raw, tokens, [s.params for s in states])
    for state, token_id in zip(states, token_ids, strict=True):
        state.record(token_id)
    return SampledTokens(token_ids=token_ids, logprobs=logprobs)


def _only_forced(scores: torch.Tensor, rows: list[int], states: Sequence[SequenceSampling]) -> torch.Tensor:
    """scores: [B, V] -> the same with `rows` allowing only their forced token (in place)."""
    tokens = torch.tensor([states[row].forced_token for row in rows], device=scores.device)
    only = torch.full((len(rows), scores.shape[1]), float("-inf"), dtype=scores.dtype, device=scores.device)
    scores[rows] = only.scatter_(1, tokens[:, None], 0.0)
    return scores


def _group_of(params: SamplingParams, vocab: int) -> str:
    """Which code path samples a row: greedy argmax, a small top_k head, or the whole vocabulary."""
    if params.greedy:
        return "greedy"
    return "head" if 0 < params.top_k <= min(HEAD_LIMIT, vocab - 1) else "vocab"


def _draw_group(kind: str, scores: torch.Tensor, rows: list[int], states: Sequence[SequenceSampling]) -> torch.Tensor:
    """scores: [R, V] the group's adjusted logits -> its tokens [R]."""
    if kind == "greedy":
        return scores.max(dim=-1).indices  # faster than argmax on CPU; both return the first maximum
    vocab = scores.shape[1]
    table = [_row_settings(states[row], vocab) for row in rows]
    inv_temperature, top_k, top_p, min_p, uniform = torch.tensor(table, device=scores.device).T
    filtering = [k for _, k, p, _, _ in table if k < vocab or p < 1]
    uses_min_p = any(m > 0 for _, _, _, m, _ in table)
    params = DrawParams(
        inv_temperature, top_k.long(), top_p, min_p if uses_min_p else None, uniform, max(filtering, default=0)
    )
    return draw_from_head(scores, params) if kind == "head" else draw_from_vocab(scores, params)


def _row_settings(state: SequenceSampling, vocab: int) -> tuple[float, int, float, float, float]:
    """A sampling row's (1 / temperature, top_k or V when off, top_p, min_p, this step's uniform)."""
    p = state.params
    return 1.0 / p.temperature, p.top_k if 0 < p.top_k < vocab else vocab, p.top_p, min(p.min_p, 1.0), state.uniform()


def _adjusted(raw: torch.Tensor, states: Sequence[SequenceSampling]) -> torch.Tensor:
    """raw: [B, V] -> [B, V] with each row's bias and penalties added (raw itself is left untouched)."""
    rows = [row for row, state in enumerate(states) if state.logit_adjustments]
    if not rows:
        return raw
    adjustments = [states[row].logit_adjustments for row in rows]
    row_ids = list(chain.from_iterable(repeat(row, len(adj)) for row, adj in zip(rows, adjustments, strict=True)))
    token_ids = list(chain.from_iterable(adj.keys() for adj in adjustments))
    values = list(chain.from_iterable(adj.values() for adj in adjustments))
    index = torch.tensor([row_ids, token_ids], dtype=torch.long, device=raw.device)
    values = torch.tensor(values, dtype=raw.dtype, device=raw.device)
    return raw.index_put((index[0], index[1]), values, accumulate=True)


def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]) -> list[TokenLogprobs | None]:
    """raw: [B, V] model logits, tokens: [B] -> logprobs of the chosen tokens and of each row's top alternatives."""
    rows = [row for row, p in enumerate(params) if p.logprobs]
    result: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return result
    if len(rows) < len(params):
        raw, tokens = raw[rows], tokens[rows]
    logprobs = raw.log_softmax(dim=-1)  # [R, V]
    chosen = logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()
    widest = min(max(params[row].top_logprobs for row in rows), raw.shape[1])
    top_values, top_ids = logprobs.topk(widest, dim=-1) if widest else (logprobs[:, :0], logprobs[:, :0])
    top_values, top_ids = top_values.tolist(), top_ids.long().tolist()
    for i, row in enumerate(rows):
        n = params[row].top_logprobs
        result[row] = TokenLogprobs(logprob=chosen[i], top=list(zip(top_ids[i][:n], top_values[i][:n], strict=True)))
    return result
