"""RMSNorm of float32 rows on the CPU through the C kernel `_rms_norm.c`: one call instead of torch's seven.

Optional like the other kernels (paged_attention.py): without a C compiler `KERNEL` is None and transformer.py's
RMSNorm calls torch.rms_norm.
"""

from __future__ import annotations

import torch

try:
    from inference.engine.model import _rms_norm
except ImportError:  # built without a C compiler
    _rms_norm = None

KERNEL = _rms_norm


def kernel_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return KERNEL is not None and x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2, last dim) + eps) * weight, for float32 CPU tensors (weight: [dim])."""
    # x: [..., dim] -> [..., dim]
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    KERNEL.rms_norm(out.data_ptr(), x.data_ptr(), weight.data_ptr(), x.numel() // dim, dim, eps)
    return out
