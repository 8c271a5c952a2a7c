"""The decode graphs' attention for a runner whose attention is "flex": each row reads its own live blocks of the
paged pool in place, so a step's cost follows the tokens the rows hold, not the context window.

`GatheredAttention` copies each row's blocks into a dense tensor first, padded on CUDA to the whole window (a graph
replay cannot change shape). Here the queries are [rows, H, 1, hd] and the keys and values are the layer's pool seen
as one long sequence [1, Hkv, (num_blocks + 1) * block_size, hd] (no copy; broadcast over the rows), and torch's
flex_attention visits, per row, only the blocks a BlockMask lists: `kv_num_blocks` (the row's live blocks) of
`kv_indices` (its block table). Both are graph inputs of fixed shape per bucket whose values change each step, so a
captured CUDA graph replays over the live blocks, and the CPU's compiled step never recompiles as rows grow. Within a
visited block, model/page_mask.py's mask keeps each row to its own positions.

A padding row visits only the scratch block, where it wrote its key at position 0, and attends to that one position
(`block_index` of the scratch block is pinned to 0 for it): a fully masked row could leave a NaN in scratch, which a
gather step reads (masked: 0 times NaN is NaN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.model.page_mask import block_index, page_mask_mod
from inference.engine.model.rope import rotate_half

# The sparse block size of the queries' dimension: one block holds a row's one query. A multiple of the CUDA decoding
# kernel's query tile (16, or the number of query heads per kv head when larger), which it requires.
QUERY_BLOCK = 128

FlexCall = Callable[..., torch.Tensor]


def flex_call(device: torch.device, block_size: int) -> FlexCall:
    """flex_attention as the decode graph calls it. On a CPU the whole graph is compiled, flex_attention with it. On
    CUDA the graph runs eagerly to be captured, and flex_attention eagerly is an unfused reference that scores the
    whole pool, so it is compiled on its own, once per bucket (each in a region of its own: dynamo's recompile limit
    would otherwise send the ninth bucket back to the unfused reference without a word): inductor's decoding kernel
    (one query per row, the KV split across the GPU) with key tiles of one paged block, since a row's next block lies
    anywhere in the pool (vLLM's flex backend also sets BLOCK_N to its block size)."""
    if device.type != "cuda":
        return flex_attention
    compiled: dict[int, FlexCall] = {}  # by the bucket's rows

    def call(query: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows = query.shape[0]
        if rows not in compiled:
            compiled[rows] = torch.compile(flex_attention, fullgraph=True, dynamic=False, isolate_recompiles=True)
        return compiled[rows](query, *args, kernel_options={"BLOCK_N": block_size}, **kwargs)

    return call


def view_table(view: CacheView, kv_heads: int, pool_block: torch.Tensor) -> torch.Tensor:
    """Each row's physical blocks [B, nb] long (scratch-padded), from any decode view: the paged kernel's table, a
    lone row's consecutive blocks, or kv head 0's share of the gather rows (head h's rows are offset by h pools)."""
    if view.table is not None:
        return view.table
    if isinstance(view.blocks, slice):
        return pool_block[view.blocks][None, :]
    return view.blocks[: view.blocks.numel() // kv_heads].view(view.num_rows, -1)


class FlexInputs:
    """The flex graph's page inputs for a bucket: `kv_num_blocks` [bucket, 1, 1] int32, each row's live blocks (a
    padding row: one, the scratch block), `kv_indices` [bucket, 1, 1, width] int32, each row's block table (scratch
    past it), and for the mask the same `tables` [bucket, max_blocks] long (inductor's CPU template cannot read
    its own indices in a mask) and `logical` [num_blocks + 1] long, each pool block's index in the tables.

    The width is the window's blocks on CUDA; on a CPU, inductor's flex template requires the indices to span the
    whole key length, so the tables are written into the first columns of a buffer as wide as the pool, whose other
    columns hold the scratch block for good."""

    def __init__(self, cache: KVCache, max_bucket: int):
        self.block_size, self.scratch = cache.block_size, cache.scratch
        self.kv_heads = cache.keys[0].shape[0]
        self.max_blocks = -(-cache.context_window // cache.block_size)
        width = self.max_blocks if cache.device.type == "cuda" else cache.scratch + 1
        self.indices = torch.full((max_bucket, 1, 1, width), cache.scratch, dtype=torch.int32, device=cache.device)
        self.scratch_tables = torch.full((max_bucket, self.max_blocks), cache.scratch, device=cache.device)
        self.pool_block = torch.arange(cache.scratch + 1, device=cache.device)

    def build(self, view: CacheView, bucket: int, positions: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inputs of a step whose first rows are the view's; `positions` [bucket, 1] (padding rows' 0)."""
        table = view_table(view, self.kv_heads, self.pool_block)  # [rows, nb]
        tables = self.scratch_tables[:bucket].clone()  # [bucket, max_blocks]
        tables[: table.shape[0], : table.shape[1]] = table
        self.indices[:bucket, 0, 0, : self.max_blocks] = tables
        logical = block_index(tables, self.scratch + 1)
        logical[self.scratch] = 0  # a padding row attends to the scratch block's position 0 (module docstring)
        return {
            "kv_num_blocks": (positions // self.block_size + 1).to(torch.int32).view(bucket, 1, 1),
            "kv_indices": self.indices[:bucket],
            "tables": tables,
            "logical": logical,
        }


class FlexDecodeAttention:
    """The flex decode graph's way to the KV (an attention.Attend): rotates one token's queries and keys per row,
    writes its key and value into the pool and attends over the row's live blocks in place."""

    def __init__(
        self,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        write_rows: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin_signed: torch.Tensor,
        heads: int,
        kv_heads: int,
        flex: FlexCall,
        *,
        kv_num_blocks: torch.Tensor,
        kv_indices: torch.Tensor,
        tables: torch.Tensor,
        logical: torch.Tensor,
    ):
        # positions: [B, 1]; cos, sin_signed: [B, 1, hd]; kv_num_blocks: [B, 1, 1]; kv_indices: [B, 1, 1, width];
        # tables: [B, max_blocks]; logical: [num_blocks + 1]
        self.keys, self.values, self.write_rows = keys, values, write_rows
        self.cos, self.sin_signed, self.heads, self.kv_heads, self.flex = cos, sin_signed, heads, kv_heads, flex
        pool = keys[0].shape[1] * keys[0].shape[2]
        page_mask = page_mask_mod(tables, logical, positions.view(-1), keys[0].shape[2])

        def row_mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return page_mask(b, h, b, kv)  # one query per row: the row's query is numbered by its batch index

        self.block_mask = BlockMask.from_kv_blocks(
            kv_num_blocks,
            kv_indices,
            BLOCK_SIZE=(QUERY_BLOCK, keys[0].shape[2]),
            mask_mod=row_mask,
            seq_lengths=(1, pool),
            compute_q_blocks=False,  # only a backward pass reads them, and transposing the indices is not free
        )

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        # qkv: [B, H + 2 Hkv, hd] -> [B, H * hd]
        batch, _, head_dim = qkv.shape
        heads, kv_heads = self.heads, self.kv_heads
        qk, v = qkv.split_with_sizes((heads + kv_heads, kv_heads), dim=1)
        # rotated as [B, H + Hkv, 1, hd]: inductor's CPU flex template reads the query's buffer as four-dimensional
        rotated = rotate_half(qk[:, :, None], self.cos[:, :, None], self.sin_signed[:, :, None])
        q, k = rotated.split_with_sizes((heads, kv_heads), dim=1)
        key_pool, value_pool = self.keys[layer], self.values[layer]
        key_pool.view(-1, head_dim).index_copy_(0, self.write_rows, k.reshape(-1, head_dim).to(key_pool.dtype))
        value_pool.view(-1, head_dim).index_copy_(0, self.write_rows, v.reshape(-1, head_dim).to(value_pool.dtype))
        # flex_attention needs one dtype: the one query per row is cast to the pool's, never the pool to the query's
        query = q.to(key_pool.dtype)  # [B, H, 1, hd]
        kv_shape = (1, kv_heads, -1, head_dim)
        out = self.flex(
            query, key_pool.view(kv_shape), value_pool.view(kv_shape), block_mask=self.block_mask, enable_gqa=True
        )
        return out.reshape(batch, heads * head_dim).to(qkv.dtype)
