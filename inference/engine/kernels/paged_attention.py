"""Decode attention that reads each row's keys and values where they lie in the paged KV pool (CPU).

Without it, a decode step copies every row's blocks into one buffer (kv_cache.py's gather) and then attends over the
copy with SDPA: the KV is read twice and written once per layer and step, and at a few dozen rows of a few hundred
tokens that costs more than the weights (docs/performance.md). The C kernel (`_paged_attention.c`, built with the
package) follows each row's block table instead, reads every key and value once, and skips the positions past a
row's length that a padded batch would mask. It accepts float32, float16 and bfloat16 pools and computes in float32.

The kernel is optional: where the package was installed without a C compiler it is missing, `KERNEL` is None, and
decode attends through the gather and SDPA as on other devices.
"""

from __future__ import annotations

import torch

try:
    from inference.engine.kernels import _paged_attention
except ImportError:  # built without a C compiler: the gather path serves
    _paged_attention = None

KERNEL = _paged_attention

KV_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


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
    rows, width, dim = qkv.shape
    kv_heads, pool_blocks, block_size, _ = keys.shape
    group = (width - 2 * kv_heads) // kv_heads
    out = torch.empty(rows, kv_heads * group * dim)
    KERNEL.decode(
        out.data_ptr(),
        qkv.data_ptr(),
        cos.data_ptr(),
        sin_signed.data_ptr(),
        write_rows.data_ptr(),
        keys.data_ptr(),
        values.data_ptr(),
        table.data_ptr(),
        lengths.data_ptr(),
        rows,
        kv_heads,
        group,
        dim,
        block_size,
        pool_blocks,
        table.shape[1],
        dim**-0.5,
        KV_DTYPE_CODES[keys.dtype],
    )
    return out
