"""The "flex" attention backend: a step's attention over the paged KV pool read in place, every group of the step
(prefill chunks and decode rows) in one call of torch's flex_attention over the packed queries.

The queries of all the step's rows are packed into one sequence [1, H, T, hd]; the keys and values are a layer's
pool seen as one long sequence [1, Hkv, blocks * block_size, hd] (a view, no copy); the mask (model/page_mask.py)
lets each query see its own row's blocks, causally. The block mask, built once per step and shared by every layer,
names for each block of Q_BLOCK queries the pool blocks held by the rows those queries belong to, so a fused kernel
(CUDA: the compiled call) visits only live blocks. Eagerly (the CPU's path) flex_attention is exact but unfused: it
scores every query against every key in the view and masks, so the view stops at the blocks handed out so far,
whose values are finite (kv_cache.py: a masked NaN would still poison the weighted sum).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.kv.long_tensor import long_tensor
from inference.engine.model.page_mask import block_index, page_mask_mod
from inference.engine.model.rope import rotate_half

# Queries per block of the block mask (and per tile of the CUDA kernel): the smallest tile the kernel takes, so the
# decode rows that share a query block, each visiting every block of the others, are as few as can be.
Q_BLOCK = 16


@functools.cache
def eager_flex() -> Callable[..., torch.Tensor]:
    """flex_attention run eagerly, the CPU path on purpose (exact; the inductor CPU template compiles for ~20 s per
    shape): its warning that it is not compiled, shown once per process at the first call, says nothing to an
    operator, so it is silenced here, just before that call."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
    return flex_attention


@functools.cache
def compiled_flex() -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process (the CUDA path), for any number of queries and pool length."""
    return torch.compile(flex_attention, dynamic=True, fullgraph=True)


class FlexAttention:
    """One step's attention through flex_attention: rotates all T rows' queries and keys at once, stores the new keys
    and values with one index_copy per pool, attends in one call (the `attend` a Transformer's blocks are given, as
    CacheAttention is for the gather backend)."""

    __slots__ = ("cache", "cos", "sin_signed", "heads", "kv_heads", "write_rows", "block_mask", "blocks", "call")

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
        self.cache, self.cos, self.sin_signed = cache, cos, sin_signed
        self.heads, self.kv_heads = heads, kv_heads
        self.write_rows = torch.cat([view.write_rows for view in views]) if len(views) > 1 else views[0].write_rows
        self.blocks = cache.zeroed_blocks  # the pool's blocks attention reads (a prefix, see the module docstring)
        self.block_mask = step_block_mask(cache, views, self.blocks)
        self.call = self._compiled if cache.device.type == "cuda" else eager_flex()

    def _compiled(self, *args, **kwargs) -> torch.Tensor:
        # the kernel's tiles are the block mask's blocks (as vLLM's flex backend sets them), and the decoding kernel,
        # which takes other tiles, is never chosen
        options = {"FORCE_USE_FLEX_ATTENTION": True, "BLOCK_M": Q_BLOCK, "BLOCK_N": self.cache.block_size}
        return compiled_flex()(*args, **kwargs, kernel_options=options)

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        # qkv: [T, H + 2 Hkv, hd] -> [T, H * hd]
        tokens, _, head_dim = qkv.shape
        heads, kv_heads = self.heads, self.kv_heads
        qk, v = qkv.split_with_sizes((heads + kv_heads, kv_heads), dim=1)
        q, k = rotate_half(qk, self.cos, self.sin_signed).split_with_sizes((heads, kv_heads), dim=1)
        keys, values = self.cache.keys[layer], self.cache.values[layer]  # [Hkv, num_blocks + 1, bs, hd]
        keys.view(-1, head_dim).index_copy_(0, self.write_rows, k.reshape(-1, head_dim).to(keys.dtype))
        values.view(-1, head_dim).index_copy_(0, self.write_rows, v.reshape(-1, head_dim).to(values.dtype))
        padded = self.block_mask.seq_lengths[0]
        q = F.pad(q.transpose(0, 1), (0, 0, 0, padded - tokens)).unsqueeze(0)  # [1, H, T padded, hd]
        seen = (1, kv_heads, self.blocks * self.cache.block_size, head_dim)
        pool_keys = keys[:, : self.blocks].view(seen).to(q.dtype)  # a no-op unless the pool has a dtype of its own
        pool_values = values[:, : self.blocks].view(seen).to(q.dtype)
        out = self.call(q, pool_keys, pool_values, block_mask=self.block_mask, enable_gqa=heads != kv_heads)
        return out[0, :, :tokens].transpose(0, 1).reshape(tokens, heads * head_dim)


def step_block_mask(cache: KVCache, views: list[CacheView], blocks: int) -> BlockMask:
    """The step's block mask over the first `blocks` blocks of the pool: its mask_mod is page_mask_mod over every
    row of the step (their tables stacked, the queries packed, padded to a whole number of Q_BLOCKs with queries at
    position -1, which attend to nothing), and each query block visits the blocks its rows hold."""
    width = max(view.table.shape[1] for view in views)
    tables = torch.cat([F.pad(view.table, (0, width - view.table.shape[1]), value=cache.scratch) for view in views])
    positions = torch.cat([view.positions.reshape(-1) for view in views])  # [T]
    counts = [view.positions.shape[1] for view in views for _ in range(view.num_rows)]  # each row's queries
    tokens, rows = positions.numel(), len(counts)
    query_rows = torch.repeat_interleave(
        torch.arange(rows, device=cache.device), long_tensor(counts, cache.device), output_size=tokens
    )  # [T]
    padded = -(-tokens // Q_BLOCK) * Q_BLOCK
    visited = tables[query_rows]  # [T, nb]: the blocks each query's row holds
    visited = F.pad(visited, (0, 0, 0, padded - tokens), value=cache.scratch).view(padded // Q_BLOCK, -1)
    kv_num_blocks, kv_indices = distinct_blocks(visited, cache.scratch)
    mask_mod = page_mask_mod(
        tables,
        block_index(tables, cache.scratch + 1),
        F.pad(positions, (0, padded - tokens), value=-1),
        cache.block_size,
        F.pad(query_rows, (0, padded - tokens)),
    )
    return BlockMask.from_kv_blocks(
        kv_num_blocks[None, None],
        kv_indices[None, None],
        BLOCK_SIZE=(Q_BLOCK, cache.block_size),
        mask_mod=mask_mod,
        seq_lengths=(padded, blocks * cache.block_size),
        compute_q_blocks=False,  # forward only: no transposed (key block -> query blocks) index is needed
    )


def distinct_blocks(candidates: torch.Tensor, scratch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's distinct blocks, the scratch block left out, packed to the front: (their count [Q] int32, the
    blocks [Q, N] int32, the tail after the count unused). candidates: [Q, N] long. Sorting each row puts repeats
    side by side; no step of it waits on the device."""
    ordered = candidates.sort(dim=1).values
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    keep = first & (ordered != scratch)
    width = ordered.shape[1]
    slot = torch.where(keep, keep.cumsum(1) - 1, width)  # where each kept block goes; the rest into a spare column
    packed = torch.zeros(ordered.shape[0], width + 1, dtype=ordered.dtype, device=ordered.device)
    packed.scatter_(1, slot, ordered)
    return keep.sum(1, dtype=torch.int32), packed[:, :width].to(torch.int32)
