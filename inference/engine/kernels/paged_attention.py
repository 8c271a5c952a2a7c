"""Decode attention that reads each row's keys and values where they lie in the paged KV pool (CPU).

Without it, a decode step copies every row's blocks into one buffer (kv_cache.py's gather) and then attends over the
copy with SDPA: the KV is read twice and written once per layer and step, and at a few dozen rows of a few hundred
tokens that costs more than the weights (docs/performance.md). The C kernel (`_paged_attention.c`, built with the
package) follows each row's block table instead, reads every key and value once, and skips the positions past a
row's length that a padded batch would mask. It accepts float32, float16 and bfloat16 pools and computes in float32.

The kernel is optional (switch.py): without a C compiler, or with PANTHEON_KERNELS=off, `KERNEL` is None, and
decode attends through the gather and SDPA as on other devices. `attend_into` checks the tensors (checks.py) before
their addresses reach C.
"""

from __future__ import annotations

import torch

from inference.engine.kernels.checks import mismatch, need
from inference.engine.kernels.switch import load

KERNEL = load("_paged_attention")

# The pool dtypes the kernel reads, each with its code as `_paged_attention.c` defines it.
KV_DTYPE_CODES: dict[torch.dtype, int] = (
    {} if KERNEL is None else {getattr(torch, name): code for name, code in KERNEL.KV_DTYPES.items()}
)


def kernel_serves(device: torch.device, kv_dtype: torch.dtype) -> bool:
    """Whether decode steps on that device with a pool of that dtype go through the kernel."""
    return KERNEL is not None and device.type == "cpu" and kv_dtype in KV_DTYPE_CODES


def decode_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    write_rows: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """One decode step of one layer in one call: RoPE on each row's query heads and key, the key and value stored at
    `write_rows`, then each row's query heads attend over positions `[0, lengths[b])` of its blocks `table[b]`;
    float32 `[B, H * hd]`.

    One call instead of the rotation, the two stores and the attention as a dozen torch ops: at decode sizes each op
    costs more in dispatch than in arithmetic, a dozen times per layer and step."""
    # qkv: [B, H + 2 Hkv, hd] (query heads kv-head-major); cos, sin_signed: [B, hd] float32 (transformer.rope_tables);
    # keys, values: [Hkv, pool_blocks, block_size, hd]; write_rows: [B * Hkv] long; table: [B, nb] long;
    # lengths: [B] long
    qkv, cos, sin_signed = qkv.float().contiguous(), cos.float().contiguous(), sin_signed.float().contiguous()
    kv_heads = keys.shape[0]
    out = torch.empty(qkv.shape[0], (qkv.shape[1] - 2 * kv_heads) * qkv.shape[2])
    attend_into(out, qkv, cos, sin_signed, keys, values, write_rows, table, lengths)
    return out


def attend_into(
    out: torch.Tensor,
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    write_rows: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
) -> None:
    """decode_attention into `out` ([B, H * hd] float32), every tensor as the kernel reads it already: contiguous,
    qkv, cos and sin_signed float32 (qkv [B, (H + 2 Hkv) * hd] or [B, H + 2 Hkv, hd]: the kernel reads flat rows)."""
    for name, t in (("qkv", qkv), ("cos", cos), ("sin_signed", sin_signed), ("out", out)):
        need(t, name, torch.float32)
    need(keys, "keys", keys.dtype, 4)
    need(values, "values", keys.dtype, 4)
    for name, t in (("write_rows", write_rows), ("table", table), ("lengths", lengths)):
        need(t, name, torch.int64)
    code = KV_DTYPE_CODES.get(keys.dtype)
    if code is None:
        raise TypeError(f"the KV pool is {keys.dtype}; the kernel reads {list(KV_DTYPE_CODES)}")
    kv_heads, pool_blocks, block_size, dim = keys.shape
    rows = lengths.shape[0]
    heads = qkv.numel() // (rows * dim) if rows * dim else 0  # H + 2 Hkv
    group = (heads - 2 * kv_heads) // kv_heads
    if (
        values.shape != keys.shape
        or qkv.numel() != rows * heads * dim
        or group < 1
        or heads != (group + 2) * kv_heads
        or cos.numel() != rows * dim
        or sin_signed.numel() != rows * dim
        or out.numel() != rows * kv_heads * group * dim
        or write_rows.numel() != rows * kv_heads
        or table.dim() != 2
        or table.shape[0] != rows
        or lengths.dim() != 1
    ):
        raise mismatch(
            "the attention's tensors do not fit together",
            qkv=qkv, cos=cos, sin_signed=sin_signed, keys=keys, values=values, write_rows=write_rows, table=table,
            lengths=lengths, out=out,
        )  # fmt: skip
    KERNEL.decode(
        out.data_ptr(), qkv.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(), write_rows.data_ptr(),
        keys.data_ptr(), values.data_ptr(), table.data_ptr(), lengths.data_ptr(), rows, kv_heads, group, dim,
        block_size, pool_blocks, table.shape[1], dim**-0.5, code,
    )  # fmt: skip
