"""Skip marks for the tests of a C kernel: with PANTHEON_KERNELS=off (CI's second pass over tests/engine) or a build
without a C compiler the kernel is not there, and torch's path, which the rest of the suite exercises, serves."""

import pytest

from inference.engine import kernels
from inference.engine.kernels import paged_attention, pointwise

WHY = "the C kernels are off (PANTHEON_KERNELS=off) or were not built"

needs_block_kernel = pytest.mark.skipif(not kernels.block_kernel_runs(), reason=f"{WHY}: no block kernel")
needs_paged_kernel = pytest.mark.skipif(paged_attention.KERNEL is None, reason=f"{WHY}: no paged attention kernel")
needs_pointwise_kernel = pytest.mark.skipif(pointwise.KERNEL is None, reason=f"{WHY}: no pointwise kernel")
needs_float_kernel = pytest.mark.skipif(
    not kernels.float_kernel_runs(), reason=f"{WHY}, or the CPU lacks AVX2 and FMA: no float32 kernel"
)
needs_transposed_kernel = pytest.mark.skipif(
    not kernels.transposed_kernel_runs(), reason=f"{WHY}, or the CPU lacks AVX2 and FMA: no transposed kernel"
)
needs_every_kernel = pytest.mark.skipif(
    not {"block_matmul", "paged_attention", "pointwise"} <= set(kernels.active_kernels()),
    reason=f"{WHY}: the decode plan is a list of C kernel calls",
)
