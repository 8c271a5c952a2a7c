"""The decoder layer's row-wise work on float32 CPU rows through the C kernels of `_pointwise.c`: RMSNorm (with the
residual add before it) and SwiGLU, one call each instead of torch's two to eight.

Optional like the other kernels (switch.py): without a C compiler, or with PANTHEON_KERNELS=off, `KERNEL` is None
and transformer.py calls torch's ops. The `*_into` calls check the tensors (checks.py) before their addresses reach
C.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.kernels.checks import explain, mismatch
from inference.engine.kernels.switch import load

KERNEL = load("_pointwise")
F32 = torch.float32


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
    rms_norm_into(out, x, weight, eps, residual)
    return out


def rms_norm_into(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> None:
    """rms_norm into `out` (x's shape), every tensor contiguous float32 already."""
    run, args = rms_norm_call(out, x, weight, eps, residual)
    run(*args)


def rms_norm_call(
    out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[Callable[..., None], tuple]:
    """rms_norm_into's checked C call (function, arguments)."""
    if not (
        x.is_cpu and x.dtype is F32 and x.is_contiguous() and out.is_cpu and out.dtype is F32 and out.is_contiguous()
        and weight.is_cpu and weight.dtype is F32 and weight.is_contiguous()
        and (residual is None or (residual.is_cpu and residual.dtype is F32 and residual.is_contiguous()))
    ):  # fmt: skip
        explain(F32, x=x, out=out, weight=weight, **({} if residual is None else {"residual": residual}))
    xs, ws, numel = x.size(), weight.size(), x.numel()
    if (
        len(ws) != 1
        or not xs
        or xs[-1] != ws[0]
        or out.numel() != numel
        or (residual is not None and residual.numel() != numel)
    ):
        raise mismatch("the norm's tensors do not fit together", x=x, weight=weight, out=out, residual=residual)
    added = 0 if residual is None else residual.data_ptr()
    return KERNEL.rms_norm, (out.data_ptr(), x.data_ptr(), added, weight.data_ptr(), numel // ws[0], ws[0], eps)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of float32 CPU rows holding gate then up (the fused gate/up projection's output)."""
    # gate_up: [..., 2 F] -> [..., F]
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    swiglu_into(out, gate_up)
    return out


def swiglu_into(out: torch.Tensor, gate_up: torch.Tensor) -> None:
    """swiglu into `out` ([..., F]), both contiguous float32 already."""
    run, args = swiglu_call(out, gate_up)
    run(*args)


def swiglu_call(out: torch.Tensor, gate_up: torch.Tensor) -> tuple[Callable[..., None], tuple]:
    """swiglu_into's checked C call (function, arguments)."""
    if not (
        gate_up.is_cpu and gate_up.dtype is F32 and gate_up.is_contiguous()
        and out.is_cpu and out.dtype is F32 and out.is_contiguous()
    ):  # fmt: skip
        explain(F32, gate_up=gate_up, out=out)
    gs, os_, numel = gate_up.size(), out.size(), out.numel()
    if not os_ or not gs or gs[-1] != 2 * os_[-1] or 2 * numel != gate_up.numel():
        raise mismatch("the SwiGLU's tensors do not fit together", gate_up=gate_up, out=out)
    return KERNEL.swiglu, (out.data_ptr(), gate_up.data_ptr(), numel // os_[-1], os_[-1])
