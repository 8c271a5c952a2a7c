"""Linear layers that keep a GGUF Q4_0, Q8_0 or K-quant file's blocks in memory (CPU): 4-bit (Q4_0) or 8-bit (Q8_0)
codes with a float16 scale per 32 input values, 18 or 34 bytes per block as in the file; Q4_K's and Q5_K's 4- or
5-bit codes with a scale and a minimum per 32 values (152 and 184 bytes per 256 against the file's 144 and 176);
Q6_K's 6-bit codes with a scale per 16 values (212 bytes per 256 against 210); Q5_0's 5-bit codes with a float16
scale per 32 values, Q4_1's and Q5_1's 4- or 5-bit codes with a float16 scale and minimum per 32 values (22, 20 and
24 bytes per block, as in the file).
The C kernel `_matmul.c` multiplies them; each format's encoding and decoding is in block_codecs.py.

Re-encoding the file's float32 expansion with GGUF's rule gives back the file's codes and scales exactly (a block's
value of largest magnitude is code 0 (Q4_0) or +-127 (Q8_0) times its scale, so the scale is found again, and every
value divides to its code), so these layers compute with the file's own weights: for Q4_0 half the bytes of int8
per output channel, and for both none of its requantization error. Each call quantizes the activations to 8 bits
per block of 32 values of a row, as llama.cpp does; docs/quantized-weights.md has the error this gives against the
float32 expansion, and the speed against the int8 form.

A load makes every layer from the file's bytes, which loaders/gguf.py keeps for the quantized tensors, so it never
expands them to float32 (`encode_q4_0_blocks`, `encode_q8_0_blocks`, `encode_q4_k`, ...); the K-quants' scales could
not be found again from the expansion anyway (a Q4_K block's minimum is not one of its values, a Q6_K block has two
scales).

The kernel is optional (kernels/switch.py): without a C compiler `KERNEL` is None and these layers take another form
(stored_quant.py).
"""

from __future__ import annotations

import torch
from torch import nn

from inference.engine import kernels
from inference.engine.quant.block_codecs import (
    decode_q4_0,
    decode_q4_1,
    decode_q4_k,
    decode_q5_0,
    decode_q5_1,
    decode_q5_k,
    decode_q6_k,
    decode_q8_0,
    encode_q3_k,
    encode_q4_0,
    encode_q4_0_blocks,
    encode_q4_1_blocks,
    encode_q4_k,
    encode_q5_0_blocks,
    encode_q5_1_blocks,
    encode_q5_k,
    encode_q6_k,
    encode_q8_0,
    encode_q8_0_blocks,
)


class _BlockProduct(nn.Module):
    """A linear layer the block kernel multiplies: `write` fills an output's columns from float32 rows."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None

    def write(self, rows: torch.Tensor, out: torch.Tensor, column: int = 0) -> None:
        """out[:, column : column + out_features] = rows @ weight^T, without the bias (rows [R, in] and out [R, *]
        contiguous float32)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        # A decode step calls this for every linear layer with a few rows: each tensor op skipped here (a reshape, a
        # conversion) is a microsecond of dispatch saved per call, which at one row is a tenth of the kernel's time.
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32 or not rows.is_contiguous():
            rows = rows.float().contiguous()
        out = torch.empty(rows.shape[0], self.out_features)
        self.write(rows, out)
        if x.dim() != 2:
            out = out.view(*x.shape[:-1], self.out_features)
        if x.dtype != torch.float32:
            out = out.to(x.dtype)
        return out if self.bias is None else out + self.bias


class BlockLinear(_BlockProduct):
    """A linear layer whose weight is a GGUF file's blocks, codes and scales as `encode` lays them out from the file's
    bytes (`stored`, [out, bytes per row]), or for Q4_0 and Q8_0 as `encode_weight` finds them again in the float
    weight; `decode` gives the float weight back (codes, scales, in_features)."""

    FORMAT: str  # the weight format's name in the kernel (kernels.FORMATS)
    encode: staticmethod
    decode: staticmethod
    encode_weight: staticmethod | None = None

    def __init__(self, linear: nn.Linear, stored: torch.Tensor | None = None):
        super().__init__()
        if stored is None and self.encode_weight is None:
            raise ValueError(f"a {type(self).__name__} is made from the file's bytes")
        codes, scales = self.encode(stored) if stored is not None else self.encode_weight(linear.weight.detach())
        self.out_features, self.in_features = linear.weight.shape
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)
        self.bias = linear.bias
        held = (codes, scales) + (() if self.bias is None else (self.bias,))
        self.weight_nbytes = sum(t.numel() * t.element_size() for t in held)

    def weight_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows [len(ids), in] of the weight that the output features `ids` take: a tied output head's
        rows are the token embedding's (quant/stored_embedding.py)."""
        rows = self.decode(self.codes.index_select(0, ids), self.scales.index_select(0, ids), self.in_features)
        return rows.contiguous()  # without a padded row's tail

    def write(self, rows: torch.Tensor, out: torch.Tensor, column: int = 0) -> None:
        kernels.block_matmul(out, rows, self.codes, self.scales, self.FORMAT, self.in_features, column)


class BlockParts(_BlockProduct):
    """A linear layer fused from tensors of several GGUF types, as a Q4_K_M file's q and k (Q4_K) and v (Q6_K in half
    its layers): each run of output rows of one type is a block layer of its own (`parts`, bias-free), writing its
    columns of the one output, so every part keeps its file's blocks."""

    def __init__(self, linear: nn.Linear, parts: list[BlockLinear]):
        super().__init__()
        self.out_features, self.in_features = linear.weight.shape
        if sum(part.out_features for part in parts) != self.out_features:
            raise ValueError("the parts' rows are not the layer's")
        self.parts = nn.ModuleList(parts)
        self.columns = [sum(part.out_features for part in parts[:i]) for i in range(len(parts))]
        self.bias = linear.bias

    def write(self, rows: torch.Tensor, out: torch.Tensor, column: int = 0) -> None:
        for part, start in zip(self.parts, self.columns, strict=True):
            part.write(rows, out, column + start)


class Q4_0Linear(BlockLinear):
    """Q4_0 blocks: 4-bit codes (the value plus 8, two to a byte)."""

    FORMAT = "q4_0"
    encode = staticmethod(encode_q4_0_blocks)
    decode = staticmethod(decode_q4_0)
    encode_weight = staticmethod(encode_q4_0)


class Q8_0Linear(BlockLinear):
    """Q8_0 blocks: signed 8-bit codes."""

    FORMAT = "q8_0"
    encode = staticmethod(encode_q8_0_blocks)
    decode = staticmethod(decode_q8_0)
    encode_weight = staticmethod(encode_q8_0)


class Q5_0Linear(BlockLinear):
    """Q5_0 blocks: 5-bit codes (the value plus 16; the low four bits two to a byte, the fifth in a plane of their
    own), from the file's bytes. llama.cpp's K-quant files hold Q5_0 where a row is not a multiple of 256 values, and
    a Q5_0 file all through."""

    FORMAT = "q5_0"
    encode = staticmethod(encode_q5_0_blocks)
    decode = staticmethod(decode_q5_0)


class Q4_1Linear(BlockLinear):
    """Q4_1 blocks: 4-bit codes (0..15, two to a byte) and each block's scale and minimum, from the file's bytes."""

    FORMAT = "q4_1"
    encode = staticmethod(encode_q4_1_blocks)
    decode = staticmethod(decode_q4_1)


class Q5_1Linear(BlockLinear):
    """Q5_1 blocks: 5-bit codes (the low four bits two to a byte, the fifth in a plane of their own) and each block's
    scale and minimum, from the file's bytes. llama.cpp's K-quant files hold Q5_1 where a Q5_K row would not be a
    multiple of 256 values."""

    FORMAT = "q5_1"
    encode = staticmethod(encode_q5_1_blocks)
    decode = staticmethod(decode_q5_1)


class Q3_KLinear(BlockLinear):
    """Q3_K super-blocks held as Q6_K's (`encode_q3_k`), from the file's bytes: the file's weights exactly."""

    FORMAT = "q6_k"
    encode = staticmethod(encode_q3_k)
    decode = staticmethod(decode_q6_k)


class Q4_KLinear(BlockLinear):
    """Q4_K super-blocks: 4-bit codes (0..15, two to a byte) and each super-block's scales and mins, from the file's
    bytes."""

    FORMAT = "q4_k"
    encode = staticmethod(encode_q4_k)
    decode = staticmethod(decode_q4_k)


class Q5_KLinear(BlockLinear):
    """Q5_K super-blocks: 5-bit codes (the low four bits two to a byte, the fifth in a plane of their own) and each
    super-block's scales and mins, from the file's bytes."""

    FORMAT = "q5_k"
    encode = staticmethod(encode_q5_k)
    decode = staticmethod(decode_q5_k)


class Q6_KLinear(BlockLinear):
    """Q6_K super-blocks: 6-bit codes (the low four bits two to a byte, the top two in planes of their own) and each
    super-block's scales, from the file's bytes."""

    FORMAT = "q6_k"
    encode = staticmethod(encode_q6_k)
    decode = staticmethod(decode_q6_k)
