"""The decoder layer's row-wise work on float32 CPU rows through the C kernels of `_pointwise.c`: RMSNorm (with the
residual add before it) and SwiGLU, one call each instead of torch's two to eight.

Optional like the other kernels (paged_attention.py): without a C compiler `KERNEL` is None and transformer.py
calls torch's ops.
"""

from __future__ import annotations

import torch

try:
    from inference.engine.kernels import _pointwise
except ImportError:  # built without a C compiler
    _pointwise = None

KERNEL = _pointwise


def kernel_serves(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    return (
        KERNEL is not None
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and (weight is None or weight.dtype == torch.float32)
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2, last dim) + eps) * weight, for float32 CPU tensors (weight: [dim]). With `residual`, x
    first becomes x + residual, in place (x must be contiguous then): the residual stream's add, fused into the norm
    that reads its result."""
    # x, residual: [..., dim] -> [..., dim]
    if residual is not None and not x.is_contiguous():
        raise ValueError("the residual is added into x in place: x must be contiguous")
    x = x.contiguous()
    residual = None if residual is None else residual.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    added = 0 if residual is None else residual.data_ptr()
    KERNEL.rms_norm(out.data_ptr(), x.data_ptr(), added, weight.data_ptr(), x.numel() // dim, dim, eps)
    return out


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of float32 CPU rows holding gate then up (the fused gate/up projection's output)."""
    # gate_up: [..., 2 F] -> [..., F]
    gate_up = gate_up.contiguous()
    width = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], width)
    KERNEL.swiglu(out.data_ptr(), gate_up.data_ptr(), gate_up.numel() // (2 * width), width)
    return out
