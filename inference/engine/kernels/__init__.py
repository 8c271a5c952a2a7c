"""The engine's C kernels, behind one facade: every call into the extensions goes through a function here, which
takes tensors and checks their dtype, device, contiguity and shapes (checks.py) before an address reaches C, so a
slip is a Python error in one request, not a crash of the worker and every stream on it.

The extensions are optional: a host without a C compiler, or `PANTHEON_KERNELS=off` (switch.py), runs torch's path
everywhere. `active_kernels()` says which run here; the worker logs it at start and every load reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from inference.engine.kernels import matmul, paged_attention, pointwise
from inference.engine.kernels.matmul import (
    FORMATS,
    block_kernel_runs,
    block_matmul,
    block_matmul_call,
    float_kernel_runs,
    float_matmul,
    float_matmul_call,
    set_threads,
    transposed_kernel_runs,
    transposed_matmul,
    transposed_matmul_call,
)
from inference.engine.kernels.paged_attention import KV_DTYPE_CODES, BoundAttention, attend_into, decode_attention
from inference.engine.kernels.pointwise import rms_norm, rms_norm_call, rms_norm_into, swiglu, swiglu_call, swiglu_into
from inference.engine.kernels.switch import ENABLED

__all__ = [
    "BoundAttention",
    "ENABLED",
    "FORMATS",
    "KV_DTYPE_CODES",
    "active_kernels",
    "attend_into",
    "bind",
    "block_kernel_runs",
    "block_matmul",
    "block_matmul_call",
    "decode_attention",
    "float_kernel_runs",
    "float_matmul",
    "float_matmul_call",
    "rms_norm",
    "rms_norm_call",
    "rms_norm_into",
    "set_threads",
    "swiglu",
    "swiglu_call",
    "swiglu_into",
    "transposed_kernel_runs",
    "transposed_matmul",
    "transposed_matmul_call",
]


def bind(checked_call: Callable[..., tuple[Callable[..., None], tuple]], *tensors_and_sizes) -> Callable[[], None]:
    """One kernel call checked now (`checked_call`: one of the `*_call` functions, given what its `*_into` takes) with
    its addresses bound, to be made again and again with no check: for a caller that owns those tensors, keeps them
    alive and never resizes them (the decode plan's buffers and the model's weights), so that a step of a small model
    pays for the kernels rather than for checking each call's tensors anew."""
    run, arguments = checked_call(*tensors_and_sizes)
    return partial(run, *arguments)


def active_kernels() -> list[str]:
    """The kernels the engine runs in this process on this CPU, by name; empty when they are off or not built (the
    engine then runs torch's ops for all of it)."""
    runs = {
        "block_matmul": block_kernel_runs(),
        "float_matmul": float_kernel_runs(),
        "transposed_matmul": transposed_kernel_runs(),
        "paged_attention": paged_attention.KERNEL is not None,
        "pointwise": pointwise.KERNEL is not None,
    }
    return [name for name, on in runs.items() if on]


def describe() -> str:
    """One line for the worker's log: the active kernels and the block kernel's instruction set, or why none."""
    if not ENABLED:
        return "C kernels off (PANTHEON_KERNELS=off): torch's ops everywhere"
    names = active_kernels()
    if not names:
        return "C kernels not built (no C compiler at install?): torch's ops everywhere"
    return f"C kernels: {', '.join(names)} (blocks on {matmul.KERNEL.kernel_name()})"
