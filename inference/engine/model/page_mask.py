"""Which positions of the paged KV pool a query may attend to, when attention reads the pool in place
(torch's flex_attention over a layer's whole pool seen as one long key sequence) instead of gathering each row's
blocks into a dense tensor first.

A key at pool position `kv` lies in physical block `kv // block_size`. A query of row `r` at absolute position `p`
may attend to it when row r's block table holds that block, at logical index `i`, and `i * block_size + kv %
block_size <= p` (causal). The table is looked up forward only: each physical block's logical index (`block_index`,
one entry per pool block) names the one place in row r's table where the block would have to be, and the mask holds
when the table has it there. A block's logical index is the same for every row that holds it, since a shared block
is found by a key chained over every block before it (block_pool.py), so one entry per block is enough and no
per-row inverse table (rows x pool blocks) is needed. This is exact on its own; a block mask's sparsity
(which blocks each query block visits) only saves work.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# flex_attention's mask_mod: (batch, head, query index, key index) -> bool, each a scalar tensor (vmapped)
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def block_index(tables: torch.Tensor, pool_blocks: int) -> torch.Tensor:
    """Each pool block's logical index in the rows of `tables` that hold it (0 where none does: the mask then
    finds it missing from the row's table). tables: [R, nb] long, padded with the scratch block -> [pool_blocks]
    long."""
    rows, width = tables.shape
    index = torch.zeros(pool_blocks, dtype=torch.long, device=tables.device)
    logical = torch.arange(width, device=tables.device).expand(rows, width)
    return index.scatter_(0, tables.reshape(-1), logical.reshape(-1))


def page_mask_mod(
    tables: torch.Tensor,
    logical: torch.Tensor,
    query_positions: torch.Tensor,
    block_size: int,
    query_rows: torch.Tensor | None = None,
) -> MaskMod:
    """The mask of queries over the pool: `tables` [R, nb] each row's blocks (scratch-padded), `logical`
    [pool_blocks] from `block_index`, `query_positions` [Q] each query's absolute position (-1: a padding query,
    which attends to nothing). `query_rows` [Q] names each query's row when the queries of every row are packed
    into one sequence (batch 1); without it, a query's row is its batch index (one row per batch entry)."""
    last = tables.shape[1] - 1

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        row = b if query_rows is None else query_rows[q]
        block = kv // block_size
        index = logical[block]
        held = tables[row, index.clamp(max=last)] == block
        return held & (index * block_size + kv % block_size <= query_positions[q])

    return mask_mod
