"""Linear layers that keep a GGUF Q4_0, Q8_0 or K-quant file's blocks in memory (CPU): 4-bit (Q4_0) or 8-bit (Q8_0)
codes with a float16 scale per 32 input values, 18 or 34 bytes per block as in the file; Q4_K's and Q5_K's 4- or
5-bit codes with a scale and a minimum per 32 values (152 and 184 bytes per 256 against the file's 144 and 176);
Q6_K's 6-bit codes with a scale per 16 values (212 bytes per 256 against 210); Q5_0's 5-bit codes with a float16
scale per 32 values, Q4_1's and Q5_1's 4- or 5-bit codes with a float16 scale and minimum per 32 values (22, 20 and
24 bytes per block, as in the file).
The C kernel `_matmul.c` multiplies them.

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
from inference.engine.quant.gguf_dequant import (
    k_low_nibbles,
    k_scales_mins,
    legacy_codes,
    q3_k_parts,
    q5_k_codes,
    q6_k_parts,
)

BLOCK = 32
SUPER = 8 * BLOCK  # the kernel's unit along the input features


def fits_blocks(linear: nn.Linear) -> bool:
    """Whether the kernel takes the layer's rows as Q4_0 or Q8_0 blocks: whole blocks, padded to whole super-blocks
    where they are not (`_kernel_rows`), as long as the padding adds at most a third to a row (576 values to 768 for
    SmolLM2, 896 to 1024 for Qwen2.5-0.5B; not 64 to 256). A K-quant's rows are whole super-blocks in the file."""
    in_features = linear.weight.shape[1]
    padded = -(-in_features // SUPER) * SUPER
    return in_features % BLOCK == 0 and 3 * padded <= 4 * in_features


def encode_q4_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q4_0 rule for each block of 32 values of a float weight [out, in], in the kernel's layout
    (`_matmul.c`): codes uint8 [out, in / 2] (value + 8, two to a byte) and float16 scales [out, in / 32]
    (a file's scales are float16: they come back exactly)."""
    out_features, in_features = weight.shape
    blocks = weight.float().reshape(out_features, in_features // BLOCK, BLOCK)
    # the value of largest magnitude, with its sign, is code 0: scale = it / -8
    extreme = blocks.gather(-1, blocks.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
    scale = (extreme / -8).to(torch.float16).float()
    divisor = torch.where(scale != 0, scale, 1.0)[..., None]
    codes, scale = _kernel_rows(torch.clamp(torch.trunc(blocks / divisor + 8.5), 0, 15).to(torch.uint8), scale)
    return _pack_planes(codes, 0), scale.to(torch.float16)


def encode_q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q8_0 rule for each block of 32 values of a float weight [out, in], in the kernel's layout: codes int8
    [out, in] (round(value / scale), halves away from zero as ggml rounds) and float16 scales [out, in / 32], the
    block's largest magnitude over 127."""
    out_features, in_features = weight.shape
    blocks = weight.float().reshape(out_features, in_features // BLOCK, BLOCK)
    scale = blocks.abs().amax(dim=-1) / 127
    inverse = torch.where(scale != 0, 1 / scale, 0.0)[..., None]
    scaled = blocks * inverse
    codes, scale = _kernel_rows((torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).to(torch.int8), scale)
    return codes.reshape(out_features, -1), scale.to(torch.float16)


Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES = 110, 144, 176, 210  # a super-block of each in the file


def encode_q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_K tensor's bytes [out, in / 256 * 144] in the kernel's layout: codes uint8 [out, in / 2] (0..15, packed as
    Q4_0's) and scales uint8 [out, in / 256, 24], each super-block's `KScales` (`_matmul.c`): d and dmin as float32,
    then the eight scales and the eight mins as bytes."""
    supers = blocks.reshape(-1, Q4_K_BYTES)
    codes = k_low_nibbles(supers[:, 16:])
    return _pack_planes(_interleave(codes.reshape(blocks.shape[0], -1, BLOCK)), 0), _k_scales(supers, blocks.shape[0])


def encode_q5_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q5_K tensor's bytes [out, in / 256 * 176] in the kernel's layout: codes uint8 [out, in / 256 * 160] (the low
    four bits packed as Q4_0's, then the plane of fifth bits) and scales as Q4_K's."""
    supers = blocks.reshape(-1, Q5_K_BYTES)
    codes = q5_k_codes(supers)
    return _pack_planes(_interleave(codes.reshape(blocks.shape[0], -1, BLOCK)), 1), _k_scales(supers, blocks.shape[0])


def _k_scales(supers: torch.Tensor, out_features: int) -> torch.Tensor:
    """Q4_K or Q5_K super-blocks' `KScales`, uint8 [out, supers per row, 24]."""
    d, dmin = (supers[:, i : i + 2].contiguous().view(torch.float16).float() for i in (0, 2))
    scales, mins = k_scales_mins(supers[:, 4:16])
    sizes = torch.cat([d, dmin], dim=1).view(torch.uint8)  # [supers, 8]
    return torch.cat([sizes, scales.to(torch.uint8), mins.to(torch.uint8)], dim=1).reshape(out_features, -1, 24)


def decode_q4_k(codes: torch.Tensor, kscales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q4_K codes and scales stand for, computed as the file's expansion is
    (`in_features`: as the padded formats' decoders take it; K-quant rows are never padded)."""
    return _decode_with_mins(_unpack_planes(codes, 0), kscales)[:, :in_features]


def decode_q5_k(codes: torch.Tensor, kscales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q5_K codes and scales stand for, computed as the file's expansion is."""
    return _decode_with_mins(_unpack_planes(codes, 1), kscales)[:, :in_features]


def _decode_with_mins(vectors: torch.Tensor, kscales: torch.Tensor) -> torch.Tensor:
    out_features = vectors.shape[0]
    sizes = kscales[..., :8].contiguous().view(torch.float32)  # [out, supers, 2]: d, dmin
    scales, mins = kscales[..., 8:16].float(), kscales[..., 16:].float()
    values = _deinterleave(vectors).float().reshape(out_features, -1, 8, BLOCK)
    weight = (sizes[..., :1] * scales)[..., None] * values - (sizes[..., 1:] * mins)[..., None]
    return weight.reshape(out_features, -1)


def encode_q6_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q6_K tensor's bytes [out, in / 256 * 210] in the kernel's layout: codes uint8 [out, in / 256 * 192] (the
    codes 0..63, their low four bits packed as Q4_0's, then two planes of top bits) and scales uint8
    [out, in / 256, 20], each super-block's `Q6Scales` (`_matmul.c`): d as float32, then each block's scale of its
    first 16 values, then of its second 16."""
    return _q6_k_layout(*q6_k_parts(blocks.reshape(-1, Q6_K_BYTES)), blocks.shape[0])


def encode_q3_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q3_K tensor's bytes [out, in / 256 * 110] in Q6_K's layout: its codes (-4..3) and 6-bit scales are Q6_K
    codes and scales too, so the kernel multiplies exactly the file's weights (in 212 bytes per 256 values against the
    file's 110: Q6_K's speed, not Q3_K's)."""
    return _q6_k_layout(*q3_k_parts(blocks.reshape(-1, Q3_K_BYTES)), blocks.shape[0])


def _q6_k_layout(
    q: torch.Tensor, scales: torch.Tensor, d: torch.Tensor, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q6_k_parts' codes, scales and d of a tensor's super-blocks in the kernel's layout (`encode_q6_k`)."""
    codes = _pack_planes(_interleave((q + 32).to(torch.uint8).reshape(out_features, -1, BLOCK)), 2)
    halves = scales.reshape(-1, 8, 2).transpose(1, 2).reshape(-1, 16)  # firsts, then seconds
    q6_scales = torch.cat([d.view(torch.uint8), halves.view(torch.uint8)], dim=1)
    return codes, q6_scales.reshape(out_features, -1, 20)


def decode_q6_k(codes: torch.Tensor, q6_scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q6_K codes and scales stand for, computed as the file's expansion is."""
    out_features = codes.shape[0]
    d = q6_scales[..., :4].contiguous().view(torch.float32)  # [out, supers, 1]
    halves = q6_scales[..., 4:].contiguous().view(torch.int8).float().reshape(out_features, -1, 2, 8)
    per_16 = (d[..., None] * halves).transpose(2, 3).reshape(out_features, -1, 16)  # the file's order of scales
    values = _deinterleave(_unpack_planes(codes, 2)).float() - 32
    return (per_16[..., None] * values.reshape(out_features, -1, 16, 16)).reshape(out_features, -1)[:, :in_features]


_PLANE_SHIFTS = {1: torch.arange(8, dtype=torch.int32), 2: torch.tensor([0, 2, 4, 6, 0, 2, 4, 6], dtype=torch.int32)}


def _pack_planes(codes: torch.Tensor, high_bits: int) -> torch.Tensor:
    """Codes [out, super-blocks, 8 vectors, 32] (at most 4 + high_bits bits) -> bytes [out, super-blocks * (128 + 32 *
    high_bits)]: per super-block the low four bits, vectors g and g + 4 sharing bytes (Q4_0's packing), then the top
    bits' planes: with one top bit, bit g of byte p is vector g's (Q5_K); with two, bits 2h and 2h + 1 of byte p of
    the first plane are vector h's, of the second vector h + 4's (Q6_K)."""
    out_features, supers = codes.shape[:2]
    nibbles = codes & 0x0F
    parts = [nibbles[:, :, :4] | (nibbles[:, :, 4:] << 4)]
    if high_bits:
        shifted = (codes >> 4).to(torch.int32) << _PLANE_SHIFTS[high_bits].reshape(1, 1, 8, 1)
        parts.append(shifted.reshape(out_features, supers, high_bits, -1, BLOCK).sum(dim=3).to(torch.uint8))
    return torch.cat(parts, dim=2).reshape(out_features, -1)


def _unpack_planes(codes: torch.Tensor, high_bits: int) -> torch.Tensor:
    """_pack_planes' inverse: bytes [out, super-blocks * (128 + 32 * high_bits)] -> codes [out, super-blocks, 8, 32]."""
    rows = codes.reshape(codes.shape[0], -1, 4 + high_bits, BLOCK)
    vectors = torch.cat([rows[:, :, :4] & 0x0F, rows[:, :, :4] >> 4], dim=2)
    if high_bits:
        planes = rows[:, :, 4:].repeat_interleave(8 // high_bits, dim=2).to(torch.int32)
        top = (planes >> _PLANE_SHIFTS[high_bits].reshape(1, 1, 8, 1)) & ((1 << high_bits) - 1)
        vectors = vectors | (top << 4).to(torch.uint8)
    return vectors


# A block of each in the file: f16 d (Q4_1, Q5_1: then f16 m), then 16 bytes of nibbles, 32 signed codes, or 4 bytes
# of fifth bits and 16 of nibbles.
Q4_0_BYTES, Q8_0_BYTES, Q5_0_BYTES, Q4_1_BYTES, Q5_1_BYTES = 18, 34, 22, 20, 24


def encode_q4_0_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_0 tensor's bytes [out, in / 32 * 18] in the kernel's layout, as `encode_q4_0` makes it from the
    expansion."""
    out_features = blocks.shape[0]
    rows = blocks.reshape(out_features, -1, Q4_0_BYTES)
    codes = legacy_codes(rows.reshape(-1, Q4_0_BYTES), 0).reshape(out_features, -1, BLOCK)
    codes, scales = _kernel_rows(codes, _f16_scales(rows))
    return _pack_planes(codes, 0), scales


def encode_q5_0_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q5_0 tensor's bytes [out, in / 32 * 22] in the kernel's layout: codes uint8 [out, in / 256 * 160] (0..31,
    the low four bits packed as Q4_0's, then the plane of fifth bits, as Q5_K's) and the float16 scales [out,
    in / 32]: the file's 22 bytes per 32 values."""
    out_features = blocks.shape[0]
    rows = blocks.reshape(out_features, -1, Q5_0_BYTES)
    codes = legacy_codes(rows.reshape(-1, Q5_0_BYTES), 1).reshape(out_features, -1, BLOCK)
    codes, scales = _kernel_rows(codes, _f16_scales(rows))
    return _pack_planes(codes, 1), scales


def encode_q4_1_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor's bytes [out, in / 32 * 20] in the kernel's layout: codes as Q4_0's (0..15, no offset) and per
    super-block the 8 blocks' float16 scales, then their 8 minimums ([out, in / 256, 16]): the file's 20 bytes per
    32 values."""
    return _with_minimums(blocks, Q4_1_BYTES, 0)


def encode_q5_1_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q5_1 tensor's bytes [out, in / 32 * 24] in the kernel's layout: codes as Q5_0's (0..31, no offset), the
    scales and minimums as Q4_1's: the file's 24 bytes per 32 values."""
    return _with_minimums(blocks, Q5_1_BYTES, 1)


def _with_minimums(blocks: torch.Tensor, block_bytes: int, high_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    out_features = blocks.shape[0]
    rows = blocks.reshape(out_features, -1, block_bytes)
    codes = legacy_codes(rows.reshape(-1, block_bytes), high_bits).reshape(out_features, -1, BLOCK)
    scales_minimums = rows[..., :4].contiguous().view(torch.float16)  # [out, blocks, 2]: d, m
    codes, padded = _kernel_rows(codes, scales_minimums)
    by_super = padded.reshape(out_features, -1, 8, 2).transpose(2, 3)  # [out, supers, (d, m), 8 blocks]
    return _pack_planes(codes, high_bits), by_super.reshape(out_features, -1, 16).contiguous()


def encode_q8_0_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's bytes [out, in / 32 * 34] in the kernel's layout, as `encode_q8_0` makes it from the
    expansion."""
    out_features = blocks.shape[0]
    rows = blocks.reshape(out_features, -1, Q8_0_BYTES)
    codes, scales = _kernel_rows(rows[..., 2:].contiguous().view(torch.int8), _f16_scales(rows))
    return codes.reshape(out_features, -1), scales


def _f16_scales(rows: torch.Tensor) -> torch.Tensor:
    """Each block's float16 scale, its first two bytes: [out, blocks]."""
    return rows[..., :2].contiguous().view(torch.float16).reshape(rows.shape[0], -1)


def decode_q8_0(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q8_0 codes and scales stand for (`in_features` leaves out the padding)."""
    values = _deinterleave(codes.reshape(codes.shape[0], -1, 8, BLOCK))
    return (values.float() * scales.float()[..., None]).reshape(codes.shape[0], -1)[:, :in_features]


def decode_q4_0(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that codes and scales stand for (`in_features` leaves out the padding)."""
    values = _deinterleave(_unpack_planes(codes, 0)).float() - 8
    return (values * scales.float()[..., None]).reshape(codes.shape[0], -1)[:, :in_features]


def decode_q5_0(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q5_0 codes and scales stand for (`in_features` leaves out the padding)."""
    values = _deinterleave(_unpack_planes(codes, 1)).float() - 16
    return (values * scales.float()[..., None]).reshape(codes.shape[0], -1)[:, :in_features]


def decode_q4_1(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q4_1 codes and scales stand for (`in_features` leaves out the padding)."""
    return _decode_with_block_minimums(_unpack_planes(codes, 0), scales, in_features)


def decode_q5_1(codes: torch.Tensor, scales: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The float32 weight [out, in] that Q5_1 codes and scales stand for (`in_features` leaves out the padding)."""
    return _decode_with_block_minimums(_unpack_planes(codes, 1), scales, in_features)


def _decode_with_block_minimums(vectors: torch.Tensor, scales: torch.Tensor, in_features: int | None) -> torch.Tensor:
    out_features = vectors.shape[0]
    d, m = scales.reshape(out_features, -1, 2, 8).float().unbind(2)  # [out, supers, 8] each
    values = _deinterleave(vectors).float()  # [out, blocks, 32]
    expanded = d.reshape(out_features, -1, 1) * values + m.reshape(out_features, -1, 1)
    return expanded.reshape(out_features, -1)[:, :in_features]


def _kernel_rows(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of codes [out, blocks, 32] in block order and their scales [out, blocks, ...] as the kernel reads them:
    rows padded to whole super-blocks with zero codes and zero scales (which add nothing to a sum; `_matmul.c` pads
    the activations alike), the codes interleaved (`_interleave`)."""
    missing = -codes.shape[1] % 8
    if missing:
        codes = torch.cat([codes, codes.new_zeros(codes.shape[0], missing, BLOCK)], dim=1)
        scales = torch.cat([scales, scales.new_zeros(scales.shape[0], missing, *scales.shape[2:])], dim=1)
    return _interleave(codes), scales


def _interleave(codes: torch.Tensor) -> torch.Tensor:
    """[out, blocks, 32] in block order -> [out, super-blocks, 8 vectors, 32 bytes]: vector g holds values 4g .. 4g + 3
    of each of a super-block's 8 blocks."""
    out_features = codes.shape[0]
    by_block = codes.reshape(out_features, -1, 8, 8, 4)  # [out, super, block j, vector g, value v]
    return by_block.transpose(2, 3).reshape(out_features, -1, 8, BLOCK)


def _deinterleave(vectors: torch.Tensor) -> torch.Tensor:
    """_interleave's inverse: [out, super-blocks, 8, 32] -> [out, blocks, 32]."""
    out_features = vectors.shape[0]
    return vectors.reshape(out_features, -1, 8, 8, 4).transpose(2, 3).reshape(out_features, -1, BLOCK)


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
