"""The wrappers' checks on the tensors they hand to C: a kernel reads and writes raw memory at the addresses it is
given, so a tensor of the wrong dtype, a non-contiguous view or a wrong size would read past its end or scribble
over another's, and crash the worker with every stream on it. Each check is a few attribute compares (a decode step
makes hundreds of these calls); what the C code cannot see, it is told here, as a ValueError or TypeError.

What they do not check is what lies inside the tensors (a block table's ids, a row's length): that would cost a
tensor op per call, and those come from the KV cache's own bookkeeping, not from a caller's reshape.
"""

from __future__ import annotations

import torch


def explain(dtype: torch.dtype, **tensors: torch.Tensor) -> None:
    """The error for whichever of `tensors` is not a contiguous CPU tensor of `dtype`: the slow path of a wrapper's
    check, which tests them all in one expression first (the attribute reads are the cost, not the raising)."""
    for name, tensor in tensors.items():
        need(tensor, name, dtype)


def need(tensor: torch.Tensor, name: str, dtype: torch.dtype, dims: int | None = None) -> None:
    """`tensor` is a contiguous CPU tensor of `dtype` (with `dims` dimensions when given), else a Python error."""
    if not (tensor.is_cpu and tensor.dtype is dtype and tensor.is_contiguous()):
        if not tensor.is_cpu:
            raise ValueError(f"{name} is on {tensor.device}: the kernel reads CPU memory")
        if tensor.dtype is not dtype:
            raise TypeError(f"{name} is {tensor.dtype}, the kernel takes {dtype}")
        raise ValueError(f"{name} is not contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()})")
    if dims is not None and tensor.dim() != dims:
        raise ValueError(f"{name} has {tensor.dim()} dimensions, the kernel takes {dims}: shape {tuple(tensor.shape)}")


def mismatch(what: str, **shapes: object) -> ValueError:
    """The error for shapes that do not fit together, naming each."""
    listed = ", ".join(f"{name} {tuple(s.shape) if isinstance(s, torch.Tensor) else s}" for name, s in shapes.items())
    return ValueError(f"{what}: {listed}")
