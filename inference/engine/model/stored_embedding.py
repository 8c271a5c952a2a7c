"""An embedding table kept as a GGUF file's quantized rows (CPU), each looked-up row expanded when a step asks for it.

A model's token embedding is a lookup, not a product: a step reads a handful of its rows. Expanded to float32 at load,
the table of a large vocabulary is most of a small model's memory (Qwen2.5-0.5B's 151,936 x 896 values: 545 MB,
where its Q4_K_M file holds the whole model in ~400 MB), and llama.cpp keeps it as the file's blocks. So a large
quantized table keeps the file's bytes, one row of blocks per token, and `forward` expands just the rows asked for
with the reader's own decoder (loaders/gguf_dequant.py): exactly the float32 rows the expanded table held.
stored_quant.KeepQuantized decides which tables are kept so (the small ones stay float32: they cost no memory worth
saving, and a lookup in float costs nothing).
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from torch import nn

from inference.engine.loaders.gguf_dequant import dequantize


class StoredEmbedding(nn.Module):
    """`rows`: the table's bytes as in the file, uint8 [vocab, bytes per row], of GGUF type `ggml_type`."""

    def __init__(self, rows: torch.Tensor, ggml_type: str, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = rows.shape[0], embedding_dim
        self.ggml_type = GGMLQuantizationType[ggml_type]
        self.register_buffer("rows", rows)
        self.weight_nbytes = rows.numel()  # loading.weight_bytes counts it: a buffer, not a parameter

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # tokens: [...] long -> [..., embedding_dim] float32
        picked = self.rows.index_select(0, tokens.reshape(-1))
        values = dequantize(picked, self.ggml_type, (picked.shape[0], self.embedding_dim))
        return values.reshape(*tokens.shape, self.embedding_dim)
