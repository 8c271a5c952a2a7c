"""An embedding table kept quantized (CPU), each looked-up row expanded when a step asks for it.

A model's token embedding is a lookup, not a product: a step reads a handful of its rows. Expanded to float32 at load,
the table of a large vocabulary is most of a small model's memory (more than its whole quantized file holds),
and llama.cpp keeps it as the file's blocks. So a large
quantized table stays quantized, and `forward` expands just the rows asked for, exactly the float32 rows the expanded
table held:
- from the file's bytes, one row of blocks per token, with the reader's own decoder (quant/gguf_dequant.py);
- or, where the table is tied to the output head and the head keeps the same blocks (quant/block_quant.py), from the
  head's rows: the table is then held once, not twice.
stored_quant.KeepQuantized decides which tables are kept so (the small ones stay float32: they cost no memory worth
saving, and a lookup in float costs nothing).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGMLQuantizationType
from torch import nn

from inference.engine.quant.block_quant import BlockLinear
from inference.engine.quant.gguf_dequant import dequantize


class StoredEmbedding(nn.Module):
    """`rows_of(ids)` gives the float32 rows [len(ids), embedding_dim] of the tokens `ids`; `weight_nbytes` is what
    this module holds of its own (loading.weight_bytes counts it)."""

    def __init__(self, rows_of: Callable[[torch.Tensor], torch.Tensor], embedding_dim: int, weight_nbytes: int):
        super().__init__()
        self.rows_of, self.embedding_dim, self.weight_nbytes = rows_of, embedding_dim, weight_nbytes

    @classmethod
    def from_file(cls, rows: torch.Tensor, ggml_type: str, embedding_dim: int) -> StoredEmbedding:
        """The table as the file's bytes `rows`, uint8 [vocab, bytes per row], of GGUF type `ggml_type`."""
        qtype = GGMLQuantizationType[ggml_type]

        def rows_of(ids: torch.Tensor) -> torch.Tensor:
            return dequantize(rows.index_select(0, ids), qtype, (ids.shape[0], embedding_dim))

        module = cls(rows_of, embedding_dim, rows.numel())
        module.register_buffer("rows", rows)
        return module

    @classmethod
    def of_head(cls, head: BlockLinear) -> StoredEmbedding:
        """The table as the tied output head's blocks, which the head holds."""
        return cls(head.weight_rows, head.in_features, 0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [...] long -> [..., embedding_dim] float32
        return self.rows_of(tokens.reshape(-1)).reshape(*tokens.shape, self.embedding_dim)
