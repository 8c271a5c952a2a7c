"""The linear layers' C kernels (`_matmul.c`): GGUF blocks (block_quant.py) and float32 weights (transformer.py's
FloatLinear), sharing one elastic pool of threads (`_elastic_pool.h`), which the worker sizes per model
(step_threads.py); and small float32 weights kept as [in, out] (TransposedLinear), on the calling thread.

Every product goes through the functions here, which check the tensors (checks.py) before their addresses reach C.
Optional like the other kernels (switch.py): without a C compiler, or with PANTHEON_KERNELS=off, `KERNEL` is None
and those layers take torch's forms instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from inference.engine.kernels.checks import explain, mismatch
from inference.engine.kernels.switch import load

KERNEL = load("_matmul")
F32 = torch.float32
if KERNEL is not None:  # as many threads as torch's ops use, until the worker says otherwise (set_threads)
    KERNEL.set_threads(torch.get_num_threads())

# The block formats' codes, by name ("q4_0", "q6_k", ...), as `_matmul.c` defines them.
FORMATS: dict[str, int] = {} if KERNEL is None else dict(KERNEL.FORMATS)
_layouts: dict[tuple[int, int], tuple[int, int]] = {}  # (format, in_features) -> a row's bytes of codes, of scales


def set_threads(threads: int) -> None:
    """How many threads each matmul shares its work among (the kernels' own pool, not torch's threads)."""
    if KERNEL is not None:
        KERNEL.set_threads(threads)


def block_kernel_runs() -> bool:
    """Whether the block kernel is there (it runs on any CPU: plain C where it lacks AVX2)."""
    return KERNEL is not None


def float_kernel_runs() -> bool:
    """Whether this CPU runs the float32 kernel (it needs AVX-512F, or AVX2 and FMA)."""
    return KERNEL is not None and KERNEL.float_available()


def transposed_kernel_runs() -> bool:
    """Whether this CPU runs the kernel for small float32 weights kept as [in, out] (it needs AVX2 and FMA)."""
    return KERNEL is not None and KERNEL.transposed_available()


def block_matmul(
    out: torch.Tensor,
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    format_name: str,
    in_features: int,
    column: int = 0,
) -> None:
    """out[:, column : column + N] = x @ W^T (block_matmul_call's product)."""
    run, args = block_matmul_call(out, x, codes, scales, format_name, in_features, column)
    run(*args)


def block_matmul_call(
    out: torch.Tensor,
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    format_name: str,
    in_features: int,
    column: int = 0,
) -> tuple[Callable[..., None], tuple]:
    """The checked C call (function, arguments) of out[:, column : column + N] = x @ W^T, W [N, in_features] the
    weight whose blocks in `format_name` are `codes` (N rows) and `scales` as block_quant.py lays them out;
    x [R, in_features] and out [R, *] float32."""
    if not (
        x.is_cpu and x.dtype is F32 and x.is_contiguous() and out.is_cpu and out.dtype is F32 and out.is_contiguous()
        and codes.is_cpu and codes.is_contiguous() and scales.is_cpu and scales.is_contiguous()
    ):  # fmt: skip
        explain(F32, x=x, out=out)
        raise ValueError("the block weight's codes and scales must be contiguous CPU tensors")
    code = FORMATS.get(format_name)
    if code is None:
        raise ValueError(f"no block format {format_name!r} in the kernel (it has {sorted(FORMATS)})")
    xs, outs, n = x.size(), out.size(), codes.size(0)
    if len(xs) != 2 or len(outs) != 2 or xs[1] != in_features or outs[0] != xs[0] or not 0 <= column <= outs[1] - n:
        raise mismatch("the block product's shapes do not fit", x=x, out=out, weight=(n, in_features), column=column)
    layout = _layouts.get((code, in_features))
    if layout is None:
        layout = _layouts[code, in_features] = KERNEL.block_layout(code, in_features)
    if codes.nbytes != n * layout[0] or scales.nbytes != n * layout[1]:
        raise mismatch(
            f"the {format_name} weight's tensors do not hold {n} rows of {in_features} values",
            codes=codes,
            scales=scales,
        )
    args = (out.data_ptr() + column * 4, x.data_ptr(), codes.data_ptr(), scales.data_ptr(), xs[0], n, in_features)
    return KERNEL.matmul, (*args, code, outs[1])


def float_matmul(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """out[R, N] = x[R, K] @ weight[N, K]^T, float32, on the kernel's pool."""
    run, args = float_matmul_call(out, x, weight)
    run(*args)


def float_matmul_call(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[Callable[..., None], tuple]:
    """float_matmul's checked C call (function, arguments)."""
    return KERNEL.float_matmul, _float_product(out, x, weight, transposed=False)


def transposed_matmul(out: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor) -> None:
    """out[R, N] = x[R, K] @ weight_t[K, N], float32, on the calling thread."""
    run, args = transposed_matmul_call(out, x, weight_t)
    run(*args)


def transposed_matmul_call(
    out: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor
) -> tuple[Callable[..., None], tuple]:
    """transposed_matmul's checked C call (function, arguments)."""
    return KERNEL.transposed_matmul, _float_product(out, x, weight_t, transposed=True)


def _float_product(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *, transposed: bool) -> tuple:
    """The arguments both float32 kernels take (out, x, weight, R, N, K), the tensors checked: x [R, K], out [R, N]
    and the weight [N, K], or [K, N] where it is kept `transposed`."""
    if not (
        x.is_cpu and x.dtype is F32 and x.is_contiguous() and weight.is_cpu and weight.dtype is F32
        and weight.is_contiguous() and out.is_cpu and out.dtype is F32 and out.is_contiguous()
    ):  # fmt: skip
        explain(F32, x=x, weight=weight, out=out)
    xs, ws = x.size(), weight.size()
    if len(xs) != 2 or len(ws) != 2:
        raise mismatch("a float product takes 2-D tensors", x=x, weight=weight, out=out)
    rows, inner = xs
    columns, weight_inner = (ws[1], ws[0]) if transposed else ws
    if weight_inner != inner or out.size() != (rows, columns):
        raise mismatch("the float product's shapes do not fit", x=x, weight=weight, out=out)
    return out.data_ptr(), x.data_ptr(), weight.data_ptr(), rows, columns, inner
