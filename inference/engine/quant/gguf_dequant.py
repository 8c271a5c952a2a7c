"""Turns GGUF tensor data (plain floats or ggml quantized blocks) into float32 torch tensors.

The engine computes in float32/bfloat16/float16, so quantized GGUF weights are expanded once, at load. Each block
format is decoded with whole-tensor torch bit operations (no Python loop over blocks); tensors are processed in
chunks of blocks only to bound the size of the integer temporaries.

Block layouts (ggml): every quantized row is a run of fixed-size blocks along `ne0`, the input dimension.
- Q8_0 (32 values, 34 bytes): f16 scale d, 32 x int8 q.                         x = d * q
- Q4_0 (32 values, 18 bytes): f16 d, 16 bytes of nibbles; low nibbles are values 0..15, high ones 16..31.
                                                                                x = d * (q - 8)
- Q4_1 (32 values, 20 bytes): f16 d, f16 m, 16 bytes of nibbles as Q4_0's.       x = d * q + m
- Q5_0 (32 values, 22 bytes): f16 d, 4 bytes whose bit j is value j's fifth bit, 16 bytes of nibbles as Q4_0's.
                                                                                x = d * (q - 16)
- Q5_1 (32 values, 24 bytes): f16 d, f16 m, then as Q5_0.                        x = d * q + m
  (llama.cpp's K-quant files hold Q5_0 and Q5_1 wherever a row is not a multiple of 256 values: a Q4_K_M file's
  Q4_K becomes Q5_0 there, Q5_K Q5_1.)
- Q4_K (256 values, 144 bytes): f16 d, f16 dmin, 12 bytes packing eight 6-bit (scale, min) pairs, 128 bytes of
  nibbles in four 32-byte groups; group g holds sub-block 2g in its low nibbles and 2g+1 in its high ones.
                                                                                x = d * sc[j] * q - dmin * m[j]
- Q5_K (256 values, 176 bytes): as Q4_K with 32 bytes of high bits between scales and nibbles; bit j of byte l
  is the fifth bit of value l of sub-block j.
- Q6_K (256 values, 210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per 16
  values), f16 d. Each 128-value half uses 64 nibble bytes and 32 high bytes.    x = d * sc[j] * (q - 32)

The other types llama.cpp writes, the i-quants, are decoded by gguf-py's reference decoder
(`gguf.quants.dequantize`, numpy): rarer, so not worth a decoder of our own; the library's is slower
(docs/quantized-weights.md) but exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Values decoded per step: enough to keep torch's kernels busy, few enough that the temporaries stay in cache.
_CHUNK_VALUES = 1 << 20


def _f16(raw: torch.Tensor) -> torch.Tensor:
    # raw: [N, 2] uint8 -> [N, 1] float32
    return raw.contiguous().view(torch.float16).float()


def _dequant_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 34] uint8 -> [N, 32]
    d = _f16(blocks[:, :2])
    q = blocks[:, 2:].contiguous().view(torch.int8).float()
    return q * d


_BIT_OF_VALUE = torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8)


def legacy_codes(blocks: torch.Tensor, high_bits: int) -> torch.Tensor:
    """The codes of Q4_0, Q4_1 (high_bits 0), Q5_0 or Q5_1 blocks (1) [N, bytes]: uint8 [N, 32], values 0..15 or
    0..31 in order. The nibbles are the last 16 bytes; a Q5 block's fifth bits the 4 before them."""
    packed = blocks[:, -16:]
    codes = torch.cat([packed & 0x0F, packed >> 4], dim=1)
    if high_bits:
        fifth = (blocks[:, -20:-16, None] >> _BIT_OF_VALUE) & 1  # [N, 4, 8]: byte b, bit i is value 8b + i's
        codes = codes | (fifth.reshape(-1, 32) << 4)
    return codes


def _dequant_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 18] uint8 -> [N, 32]
    return _f16(blocks[:, :2]) * (legacy_codes(blocks, 0).to(torch.int8) - 8).float()


def _dequant_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 20] uint8 -> [N, 32]
    return _f16(blocks[:, :2]) * legacy_codes(blocks, 0).float() + _f16(blocks[:, 2:4])


def _dequant_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 22] uint8 -> [N, 32]
    return _f16(blocks[:, :2]) * (legacy_codes(blocks, 1).to(torch.int8) - 16).float()


def _dequant_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 24] uint8 -> [N, 32]
    return _f16(blocks[:, :2]) * legacy_codes(blocks, 1).float() + _f16(blocks[:, 2:4])


def k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # packed: [N, 12] uint8 -> (scales [N, 8], mins [N, 8]) as float32.
    # Bytes 0-3: low 6 bits = scale of sub-blocks 0-3, top 2 bits = bits 4-5 of scale 4-7.
    # Bytes 4-7: the same for the mins. Bytes 8-11: low nibble = bits 0-3 of scale 4-7, high nibble = of min 4-7.
    sc_lo, m_lo, extra = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([sc_lo & 0x3F, (extra & 0x0F) | ((sc_lo >> 6) << 4)], dim=1)
    mins = torch.cat([m_lo & 0x3F, (extra >> 4) | ((m_lo >> 6) << 4)], dim=1)
    return scales.float(), mins.float()


def k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    # qs: [N, 128] uint8 -> [N, 8, 32] values 0..15, sub-block 2g from group g's low nibbles, 2g+1 from its high ones
    groups = qs.reshape(-1, 4, 1, 32)
    return torch.cat([groups & 0x0F, groups >> 4], dim=2).reshape(-1, 8, 32)


def _dequant_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 144] uint8 -> [N, 256]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = k_scales_mins(blocks[:, 4:16])
    q = k_low_nibbles(blocks[:, 16:144]).float()
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(-1, 256)


_BIT_OF_SUBBLOCK = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)


def q5_k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """Q5_K super-blocks [N, 176] -> their codes, uint8 [N, 8, 32] (0..31, sub-block by sub-block)."""
    high = (blocks[:, None, 16:48] >> _BIT_OF_SUBBLOCK) & 1  # [N, 8, 32]
    return k_low_nibbles(blocks[:, 48:176]) | (high << 4)


def _dequant_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 176] uint8 -> [N, 256]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = k_scales_mins(blocks[:, 4:16])
    q = q5_k_codes(blocks).float()
    return ((d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]).reshape(-1, 256)


_Q6_HIGH_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)


def q6_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K super-blocks [N, 210] taken apart: the values' codes minus 32, int8 [N, 16, 16] (16 values for each of
    the 16 scales), the scales int8 [N, 16] and d float32 [N, 1]."""
    # Within each 128-value half, value 32k + l takes: nibble (k // 2) of low byte 32 * (k % 2) + l, and bits
    # 2k..2k+1 of high byte l.
    low_bytes = blocks[:, 0:128].reshape(-1, 2, 1, 64)
    low = torch.cat([low_bytes & 0x0F, low_bytes >> 4], dim=2).reshape(-1, 2, 4, 32)
    high = (blocks[:, 128:192].reshape(-1, 2, 1, 32) >> _Q6_HIGH_SHIFTS) & 0x03  # [N, 2, 4, 32]
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(-1, 16, 16)
    return q, blocks[:, 192:208].contiguous().view(torch.int8), _f16(blocks[:, 208:210])


def _dequant_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 210] uint8 -> [N, 256]
    q, scales, d = q6_k_parts(blocks)
    return ((d * scales.float())[:, :, None] * q.float()).reshape(-1, 256)


_Q3_SCALE_SHIFTS = torch.tensor([0, 4], dtype=torch.uint8).reshape(1, 2, 1)
_Q3_HIGH_SCALE_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 4, 1)
_TWO_BIT_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
_Q3_MASK_SHIFTS = torch.arange(8, dtype=torch.uint8).reshape(1, 8, 1)


def q3_k_parts(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q3_K super-blocks [N, 110] taken apart as q6_k_parts takes Q6_K's: the values' codes, -4..3, int8 [N, 16, 16],
    the scales (6 bits, minus 32) int8 [N, 16] and d float32 [N, 1]; x = d * scale * code."""
    # Bytes 0-31: the codes' third bits (value 32k + l: bit k of byte l; set means no -4), 32-95: their low two bits
    # (value 128h + 32k + l: bits 2k..2k+1 of byte 32h + l), 96-107: the scales (low four bits in the nibbles of
    # bytes 96-103, the top two in bytes 104-107), 108-109: d.
    low = (blocks[:, 32:96].reshape(-1, 2, 1, 32) >> _TWO_BIT_SHIFTS) & 0x03  # [N, 2 halves, 4, 32]
    third = (blocks[:, None, 0:32] >> _Q3_MASK_SHIFTS) & 0x01  # [N, 8, 32]
    codes = low.reshape(-1, 8, 32).to(torch.int8) - ((third ^ 1) << 2).to(torch.int8)
    packed = blocks[:, 96:108]
    scale_low = ((packed[:, None, 0:8] >> _Q3_SCALE_SHIFTS) & 0x0F).reshape(-1, 16)
    scale_high = ((packed[:, None, 8:12] >> _Q3_HIGH_SCALE_SHIFTS) & 0x03).reshape(-1, 16)
    scales = (scale_low | (scale_high << 4)).to(torch.int8) - 32
    return codes.reshape(-1, 16, 16), scales, _f16(blocks[:, 108:110])


def _dequant_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 110] uint8 -> [N, 256]
    q, scales, d = q3_k_parts(blocks)
    return ((d * scales.float())[:, :, None] * q.float()).reshape(-1, 256)


def _dequant_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    # blocks: [N, 84] uint8 -> [N, 256]. Bytes 0-15: per 16 values a 4-bit scale (low nibble) and minimum (high),
    # 16-79: the 2-bit codes laid out as Q3_K's low bits, 80-81: d, 82-83: dmin.    x = d * sc * q - dmin * m
    scales, d, dmin = blocks[:, 0:16], _f16(blocks[:, 80:82]), _f16(blocks[:, 82:84])
    q = ((blocks[:, 16:80].reshape(-1, 2, 1, 32) >> _TWO_BIT_SHIFTS) & 0x03).reshape(-1, 16, 16).float()
    scaled = (d * (scales & 0x0F).float())[:, :, None] * q
    return (scaled - (dmin * (scales >> 4).float())[:, :, None]).reshape(-1, 256)


_BLOCK_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    Q.Q8_0: _dequant_q8_0,
    Q.Q4_0: _dequant_q4_0,
    Q.Q4_1: _dequant_q4_1,
    Q.Q5_0: _dequant_q5_0,
    Q.Q5_1: _dequant_q5_1,
    Q.Q4_K: _dequant_q4_k,
    Q.Q5_K: _dequant_q5_k,
    Q.Q6_K: _dequant_q6_k,
    Q.Q3_K: _dequant_q3_k,
    Q.Q2_K: _dequant_q2_k,
}
_LIBRARY_TYPES = (
    Q.IQ1_S,
    Q.IQ2_XXS,
    Q.IQ2_XS,
    Q.IQ2_S,
    Q.IQ3_XXS,
    Q.IQ3_S,
    Q.IQ4_NL,
    Q.IQ4_XS,
)
_FLOAT_TYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}

SUPPORTED_TYPES: tuple[GGMLQuantizationType, ...] = (*_FLOAT_TYPES, *_BLOCK_DECODERS, *_LIBRARY_TYPES)
# The names of the supported types that hold quantized blocks.
QUANTIZED_TYPES = frozenset(t.name for t in (*_BLOCK_DECODERS, *_LIBRARY_TYPES))


def _library_decoder(ggml_type: GGMLQuantizationType) -> Callable[[torch.Tensor], torch.Tensor]:
    def decode(blocks: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.asarray(gguf.quants.dequantize(blocks.numpy(), ggml_type), dtype=np.float32))

    return decode


def dequantize(raw: np.ndarray | torch.Tensor, ggml_type: GGMLQuantizationType, shape: Sequence[int]) -> torch.Tensor:
    """Decodes one tensor's bytes to a float32 tensor of `shape`, given in torch order (the last dim is ggml's ne0).

    `raw` is the tensor's data as stored in the file (any dtype; only its bytes are read). The result never shares
    memory with `raw`, so it outlives a memory-mapped file. Raises ValueError for a type outside SUPPORTED_TYPES or
    a byte count that does not match `shape`.
    """
    ggml_type = Q(ggml_type)
    data = _as_bytes(raw)
    n_values = int(np.prod(shape, dtype=np.int64))
    block_size, block_bytes = GGML_QUANT_SIZES[ggml_type]
    if ggml_type not in SUPPORTED_TYPES:
        raise ValueError(f"tensor type {ggml_type.name} is not supported")
    if n_values % block_size or data.numel() != n_values // block_size * block_bytes:
        raise ValueError(f"{data.numel()} bytes do not hold a {ggml_type.name} tensor of shape {list(shape)}")
    if ggml_type in _FLOAT_TYPES:
        return data.view(_FLOAT_TYPES[ggml_type]).to(torch.float32, copy=True).reshape(tuple(shape))
    decode = _BLOCK_DECODERS.get(ggml_type) or _library_decoder(ggml_type)
    blocks = data.reshape(-1, block_bytes)
    out = torch.empty(blocks.shape[0], block_size, dtype=torch.float32)
    step = max(1, _CHUNK_VALUES // block_size)
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = decode(blocks[start : start + step])
    return out.reshape(tuple(shape))


def _as_bytes(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    # -> flat uint8 tensor over the same bytes (a view where possible)
    if isinstance(raw, torch.Tensor):
        return raw.contiguous().reshape(-1).view(torch.uint8)
    array = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if not array.flags.writeable:  # torch.from_numpy warns on read-only arrays; we only ever read it
        array = array.copy()
    return torch.from_numpy(array)
