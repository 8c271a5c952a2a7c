"""The tensor half of the sampler: filter each row's distribution and draw one token per row.

Every function works on a group of rows at once, with per-row parameters as tensors; nothing loops over rows.
Filters follow transformers' warper order (top_k, then top_p on the renormalised survivors, then min_p), and
each row's randomness is one uniform number in (0, 1) used for inverse-CDF sampling. A row's result depends
only on its own logits, parameters and uniform, never on the other rows or on the group's size: no reduction
here mixes rows or runs over a width that other rows decide (prefix sums instead of softmax normalisers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# Rows whose top_k is at most this draw from a `topk` head; the others work on the whole vocabulary.
HEAD_LIMIT = 1024
# Tokens with log(p / p_max) below this (p < 1.8e-35 p_max) get weight exactly 0. Besides being harmless,
# it keeps exp() off its underflow path, which is 10-80x slower on CPU for -inf and very negative inputs.
LOG_WEIGHT_FLOOR = -80.0


@dataclass(slots=True)
class DrawParams:
    """Per-row sampling settings of a group of rows, as tensors [R] on the logits' device."""

    inv_temperature: torch.Tensor
    top_k: torch.Tensor  # long; V when off
    top_p: torch.Tensor
    min_p: torch.Tensor | None  # None when no row uses min_p
    uniform: torch.Tensor  # this step's random number in (0, 1)
    # Known on the host, so no device sync is needed to choose a code path: the largest top_k among rows
    # that filter by top_k or top_p (V for a row using top_p alone), or 0 when no row does.
    head_width: int


def draw_from_head(scores: torch.Tensor, params: DrawParams) -> torch.Tensor:
    """Sample rows that all use a top_k of at most HEAD_LIMIT, looking only at each row's top_k largest logits.

    scores: [R, V] adjusted logits -> token ids [R].
    """
    head, head_ids = scores.topk(params.head_width, dim=-1)  # [R, W], largest first
    cdf, kept = _nucleus(head, params, params.min_p)
    position = _search(cdf, kept, params.uniform)
    return head_ids.gather(1, position[:, None]).squeeze(1)


def draw_from_vocab(scores: torch.Tensor, params: DrawParams) -> torch.Tensor:
    """Sample rows over their whole vocabulary, walking the CDF in token-id order (no sort needed to draw).

    scores: [R, V] adjusted logits -> token ids [R].
    """
    vocab = scores.shape[1]
    peak = scores.amax(dim=-1)  # [R]
    # Each row's filters become one floor on its scores: keep a token when its score is at or above it.
    # min_p: p >= min_p * p_max  <=>  score >= peak + T * log(min_p)
    log_floor = torch.full_like(peak, LOG_WEIGHT_FLOOR)
    if params.min_p is not None:
        log_floor = torch.maximum(log_floor, torch.log(params.min_p))
    floor = peak + log_floor / params.inv_temperature
    if params.head_width:
        # top_k / top_p: the score of the last token they keep, compared exactly as the scores themselves
        ranked = descending_values(scores)
        _, kept = _nucleus(ranked, params, None)
        cut = ranked.gather(1, (kept - 1)[:, None]).squeeze(1)
        filtering = (params.top_k < vocab) | (params.top_p < 1)
        floor = torch.maximum(floor, torch.where(filtering, cut, -math.inf))
    # log_weight: [R, V] log(p / p_max) = (score - peak) / T
    log_weight = torch.addcmul((-peak * params.inv_temperature)[:, None], scores, params.inv_temperature[:, None])
    cdf = _weights(log_weight, scores < floor[:, None]).cumsum(dim=-1)  # unnormalised
    return _search(cdf, torch.full_like(params.top_k, vocab), params.uniform)


def descending_values(x: torch.Tensor) -> torch.Tensor:
    """Each row's values sorted largest first, without indices.

    x: [R, V] -> [R, V]. On CPU torch's sort always computes indices and is about ten times slower than
    numpy's vectorised value sort, which is why numpy does this one job there.
    """
    if x.device.type != "cpu":
        return x.sort(dim=-1, descending=True).values
    return torch.from_numpy(np.sort(x.numpy(), axis=-1)).flip(-1)


def _nucleus(ranked: torch.Tensor, params: DrawParams, min_p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """How many of each row's largest logits survive top_k, top_p and min_p (None: skip min_p).

    ranked: [R, W] logits sorted largest first. Returns the unnormalised CDF over the top_k survivors [R, W]
    and the count kept [R] (at least 1). Every filter keeps a prefix of the ranking, so one count per
    filter describes it, and top_p's count is a binary search rather than another pass.
    """
    width = ranked.shape[1]
    top_k = params.top_k.clamp(max=width)
    # weight: [R, W] p / p_max (the first is 1), zero past each row's top_k
    log_weight = (ranked - ranked[:, :1]) * params.inv_temperature[:, None]
    past_top_k = torch.arange(width, device=ranked.device)[None, :] >= top_k[:, None]
    weight = _weights(log_weight, past_top_k | (log_weight < LOG_WEIGHT_FLOOR))
    cdf = weight.cumsum(dim=-1)
    # top_p acts on the top_k survivors renormalised: a token stays while the mass strictly before it is
    # below top_p of their total, so the count is 1 + how many prefix sums fall below that mass.
    mass = params.top_p[:, None] * cdf[:, -1:]
    in_top_p = torch.searchsorted(cdf, mass).squeeze(1) + 1
    kept = torch.where(params.top_p < 1, torch.minimum(in_top_p, top_k), top_k)
    if min_p is not None:
        kept = torch.minimum(kept, (weight >= min_p[:, None]).sum(dim=-1))
    return cdf, kept.clamp(min=1)


def _weights(log_weight: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """exp(log_weight) [R, W], exactly 0 where `dropped`; overwrites log_weight."""
    return log_weight.clamp_(min=LOG_WEIGHT_FLOOR).exp_().masked_fill_(dropped, 0.0)


def _search(cdf: torch.Tensor, kept: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Inverse CDF: cdf [R, W] unnormalised, kept [R] -> position [R] of the token `uniform` lands on among
    the first `kept` positions. Zero-weight positions are never chosen."""
    total = cdf.gather(1, (kept - 1)[:, None])  # [R, 1]
    # Stay strictly below the total, so the search lands on a position whose weight is non-zero.
    target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(1)
