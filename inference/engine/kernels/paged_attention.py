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

from inference.engine.kernels.checks import explain, mismatch, need
from inference.engine.kernels.switch import load

KERNEL = load("_paged_attention")
F32, I64 = torch.float32, torch.int64

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
    if not (
        qkv.is_cpu and qkv.dtype is F32 and qkv.is_contiguous() and out.is_cpu and out.dtype is F32
        and out.is_contiguous() and cos.is_cpu and cos.dtype is F32 and cos.is_contiguous() and sin_signed.is_cpu
        and sin_signed.dtype is F32 and sin_signed.is_contiguous() and keys.is_cpu and keys.is_contiguous()
        and values.is_cpu and values.dtype is keys.dtype and values.is_contiguous() and write_rows.is_cpu
        and write_rows.dtype is I64 and write_rows.is_contiguous() and table.is_cpu and table.dtype is I64
        and table.is_contiguous() and lengths.is_cpu and lengths.dtype is I64 and lengths.is_contiguous()
    ):  # fmt: skip
        explain(F32, qkv=qkv, out=out, cos=cos, sin_signed=sin_signed)
        explain(keys.dtype, keys=keys, values=values)
        explain(I64, write_rows=write_rows, table=table, lengths=lengths)
    code = KV_DTYPE_CODES.get(keys.dtype)
    if code is None:
        raise TypeError(f"the KV pool is {keys.dtype}; the kernel reads {list(KV_DTYPE_CODES)}")
    shape, ts, ls = keys.size(), table.size(), lengths.size()
    if len(shape) != 4 or values.size() != shape or len(ts) != 2 or len(ls) != 1 or ts[0] != ls[0]:
        raise mismatch("the KV pool or the block table does not fit", keys=keys, values=values, table=table,
                       lengths=lengths)  # fmt: skip
    kv_heads, pool_blocks, block_size, dim = shape
    rows = ls[0]
    heads = qkv.numel() // (rows * dim) if rows * dim else 0  # H + 2 Hkv
    group = (heads - 2 * kv_heads) // kv_heads
    if (
        qkv.numel() != rows * heads * dim
        or group < 1
        or heads != (group + 2) * kv_heads
        or cos.numel() != rows * dim
        or sin_signed.numel() != rows * dim
        or out.numel() != rows * kv_heads * group * dim
        or write_rows.numel() != rows * kv_heads
    ):
        raise mismatch(
            "the attention's tensors do not fit together",
            qkv=qkv, cos=cos, sin_signed=sin_signed, keys=keys, write_rows=write_rows, table=table, out=out,
        )  # fmt: skip
    KERNEL.decode(
        out.data_ptr(), qkv.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(), write_rows.data_ptr(),
        keys.data_ptr(), values.data_ptr(), table.data_ptr(), lengths.data_ptr(), rows, kv_heads, group, dim,
        block_size, pool_blocks, ts[1], dim**-0.5, code,
    )  # fmt: skip


class BoundAttention:
    """attend_into for a caller that owns `out`, `qkv`, `cos` and `sin_signed` and never resizes them (the decode
    plan's buffers): those are checked once, here, and their addresses bound; what changes from step to step is
    checked where it comes in: the block table once a step (`step`), each layer's KV pool at its call. A step of a
    small model makes a few dozen kernel calls, and checking every tensor of each costs more than the call."""

    __slots__ = ("_buffers", "_tensors", "rows", "kv_heads", "group", "dim", "_view")

    def __init__(
        self, out: torch.Tensor, qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, kv_heads: int
    ):
        need(out, "out", F32, 2)
        need(qkv, "qkv", F32, 2)
        need(cos, "cos", F32, 2)
        need(sin_signed, "sin_signed", F32, 2)
        rows, dim = cos.size()
        heads, rest = divmod(qkv.size(1), dim) if dim else (0, 1)
        group = (heads - 2 * kv_heads) // kv_heads if kv_heads > 0 else 0
        if (
            rest
            or group < 1
            or heads != (group + 2) * kv_heads
            or qkv.size(0) != rows
            or sin_signed.size() != cos.size()
            or out.size() != (rows, kv_heads * group * dim)
        ):
            raise mismatch("the attention's buffers do not fit together", out=out, qkv=qkv, cos=cos, kv_heads=kv_heads)
        self._tensors = (out, qkv, cos, sin_signed)  # their memory lives as long as the call
        self._buffers = (out.data_ptr(), qkv.data_ptr(), cos.data_ptr(), sin_signed.data_ptr())
        self.rows, self.kv_heads, self.group, self.dim = rows, kv_heads, group, dim
        self._view: tuple = ()

    def step(self, write_rows: torch.Tensor, table: torch.Tensor, lengths: torch.Tensor) -> None:
        """This step's block table, lengths and write rows, checked, for every layer's call until the next step."""
        if not (
            write_rows.is_cpu and write_rows.dtype is I64 and write_rows.is_contiguous() and table.is_cpu
            and table.dtype is I64 and table.is_contiguous() and lengths.is_cpu and lengths.dtype is I64
            and lengths.is_contiguous()
        ):  # fmt: skip
            explain(I64, write_rows=write_rows, table=table, lengths=lengths)
        ts = table.size()
        if len(ts) != 2 or ts[0] != self.rows or lengths.size() != (self.rows,):
            raise mismatch("the block table does not fit the batch", table=table, lengths=lengths, rows=self.rows)
        if write_rows.numel() != self.rows * self.kv_heads:
            raise mismatch("the write rows do not fit the batch", write_rows=write_rows, rows=self.rows)
        self._view = (write_rows, table, lengths)

    def __call__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """One layer's attention over its KV pool `keys`, `values` [Hkv, pool_blocks, block_size, hd]."""
        write_rows, table, lengths = self._view
        shape = keys.size()
        code = KV_DTYPE_CODES.get(keys.dtype)
        if not (
            code is not None and keys.is_contiguous() and values.is_contiguous() and values.dtype is keys.dtype
            and keys.is_cpu and values.is_cpu and len(shape) == 4 and values.size() == shape
            and shape[0] == self.kv_heads and shape[3] == self.dim
        ):  # fmt: skip
            if code is None:
                raise TypeError(f"the KV pool is {keys.dtype}; the kernel reads {list(KV_DTYPE_CODES)}")
            explain(keys.dtype, keys=keys, values=values)
            raise mismatch("the KV pool does not fit the attention", keys=keys, values=values, kv_heads=self.kv_heads)
        out, qkv, cos, sin_signed = self._buffers
        KERNEL.decode(
            out, qkv, cos, sin_signed, write_rows.data_ptr(), keys.data_ptr(), values.data_ptr(), table.data_ptr(),
            lengths.data_ptr(), self.rows, self.kv_heads, self.group, self.dim, shape[2], shape[1], table.size(1),
            self.dim**-0.5, code,
        )  # fmt: skip
