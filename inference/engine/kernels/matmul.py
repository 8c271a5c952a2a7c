"""The linear layers' C kernels (`_matmul.c`): GGUF Q4_0 / Q8_0 blocks (block_quant.py) and float32 weights
(transformer.py's FloatLinear), sharing one elastic pool of threads (`_elastic_pool.h`), which the worker sizes per
model (step_threads.py); and small float32 weights kept as [in, out] (TransposedLinear), on the calling thread.

Optional like the other kernels (paged_attention.py): without a C compiler `KERNEL` is None, and those layers take
torch's forms instead.
"""

from __future__ import annotations

import torch

try:
    from inference.engine.kernels import _matmul
except ImportError:  # built without a C compiler
    _matmul = None

KERNEL = _matmul
if KERNEL is not None:  # as many threads as torch's ops use, until the worker says otherwise (set_threads)
    KERNEL.set_threads(torch.get_num_threads())


def set_threads(threads: int) -> None:
    """How many threads each matmul shares its work among (the kernels' own pool, not torch's threads)."""
    if KERNEL is not None:
        KERNEL.set_threads(threads)


def float_kernel_runs() -> bool:
    """Whether this CPU runs the float32 kernel (it needs AVX-512F, or AVX2 and FMA)."""
    return KERNEL is not None and KERNEL.float_available()


def transposed_kernel_runs() -> bool:
    """Whether this CPU runs the kernel for small float32 weights kept as [in, out] (it needs AVX2 and FMA)."""
    return KERNEL is not None and KERNEL.transposed_available()
