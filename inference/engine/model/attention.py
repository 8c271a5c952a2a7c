"""How the eager forward's attention reaches the KV cache: `CacheAttention`, the `attend` a Transformer's blocks are
given (transformer.Block). The layer's step itself (norm, q/k/v with its bias and q/k norm, attend, o_proj, the
feed-forward) is written once, in the blocks; an execution differs only in the `attend` it hands them (the compiled
step's gathers the paged pool into SDPA: execution/compiled_step.py) and in what it captures."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from inference.engine.kernels.paged_attention import decode_attention
from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.rope import rotate_half

# How an execution's attention reaches the KV: (layer, qkv [T, H + 2 Hkv, hd] not yet rotated) -> [T, H * hd]
Attend = Callable[[int, torch.Tensor], torch.Tensor]


class CacheAttention:
    """One step's attention over the KV cache: per group of the step (its `views`, in the order the rows follow each
    other), rotates its queries and keys, stores its new keys and values, attends over its rows' KV. A paged decode
    group does all three in one call of the paged kernel."""

    __slots__ = ("cache", "views", "cos", "sin_signed", "heads", "kv_heads")

    def __init__(
        self,
        cache: KVCache,
        views: list[CacheView],
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        heads: int,
        kv_heads: int,
    ):
        # cos, sin_signed: [T, 1, hd], the step's rows' RoPE rows
        self.cache, self.views, self.cos, self.sin_signed = cache, views, cos, sin_signed
        self.heads, self.kv_heads = heads, kv_heads

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        # qkv: [T, H + 2 Hkv, hd] -> [T, H * hd]
        if len(self.views) == 1:
            return self._group(layer, self.views[0], qkv, self.cos, self.sin_signed)
        outs, start = [], 0
        for view in self.views:
            end = start + view.positions.numel()
            outs.append(self._group(layer, view, qkv[start:end], self.cos[start:end], self.sin_signed[start:end]))
            start = end
        return torch.cat(outs)

    def _group(
        self, layer: int, view: CacheView, qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor
    ) -> torch.Tensor:
        # qkv: [B * S, H + 2 Hkv, hd]; cos, sin_signed: [B * S, 1, hd] -> [B * S, H * hd]
        cache, heads, kv_heads, head_dim = self.cache, self.heads, self.kv_heads, qkv.shape[-1]
        if view.table is not None:  # decode through the paged kernel: rotation, store and attention in one call
            keys, values = cache.keys[layer], cache.values[layer]
            out = decode_attention(qkv, cos, sin_signed, keys, values, view.write_rows, view.table, view.lengths)
            return out.to(qkv.dtype)
        batch, seq = view.positions.shape
        qk, v = qkv.split_with_sizes((heads + kv_heads, kv_heads), dim=1)
        q, k = rotate_half(qk, cos, sin_signed).split_with_sizes((heads, kv_heads), dim=1)
        group = (batch, seq, -1, head_dim)
        q, k, v = q.reshape(group), k.reshape(group), v.reshape(group)  # [B, S, H or Hkv, hd]
        keys, values = cache.update(layer, view, k, v)  # [B, Hkv, L, hd]
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # a no-op unless the KV cache has a dtype of its own
        if seq == 1 and heads != kv_heads:
            # decode: each kv head's group of query heads attends as if it were that many query positions, so the
            # keys are never repeated per query head (faster than enable_gqa at one token per row)
            q = q.reshape(batch, kv_heads, -1, head_dim)  # [B, Hkv, H / Hkv, hd]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=view.mask)
        else:
            q = q.transpose(1, 2)  # [B, H, S, hd]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=view.mask, enable_gqa=heads != kv_heads)
        return out.reshape(batch, heads, seq, head_dim).transpose(1, 2).reshape(batch * seq, -1)
