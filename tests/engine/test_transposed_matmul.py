"""The C kernel for small float32 weights kept as [in, out] (`_transposed_matmul.h`, transformer.py's
TransposedLinear): the product for every row count (tiles of four, then three, two, one) and output width (bands of
16, a last band cut mid-vector or shorter than one vector), a row's result independent of the rows beside it, and the
layers that take it."""

import pytest
import torch
from torch import nn

from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.model.transformer import TransposedLinear, cpu_linears
from tests.engine.kernel_marks import needs_transposed_kernel
from tests.engine.test_float_matmul import assert_computes_the_product

needs_kernel = needs_transposed_kernel


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 9, 30, 70])
@pytest.mark.parametrize(("out_features", "in_features"), [(5, 8), (13, 37), (16, 64), (24, 9), (344, 64), (33, 172)])
def test_the_kernel_computes_the_product(rows: int, out_features: int, in_features: int):
    assert assert_computes_the_product(TransposedLinear, rows, out_features, in_features).on_kernel()


@needs_kernel
def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    layer = TransposedLinear(nn.Linear(64, 344, bias=False))
    x = torch.randn(9, 64)
    batch = layer(x)
    for row in range(9):
        assert torch.equal(layer(x[row : row + 1]), batch[row : row + 1])


@needs_kernel
def test_leading_dimensions_are_kept():
    layer = TransposedLinear(nn.Linear(64, 40))
    x = torch.randn(2, 3, 64)
    assert torch.equal(layer(x), layer(x.reshape(6, 64)).reshape(2, 3, 40))


def test_small_layers_take_the_kernel_where_the_cpu_runs_it_and_other_dtypes_torch():
    model = cpu_linears(nn.Sequential(nn.Linear(16, 24)), float32=True)
    assert isinstance(model[0], TransposedLinear)
    assert model[0].on_kernel() == matmul_kernel.transposed_kernel_runs()
    halved = TransposedLinear(nn.Linear(16, 24).to(torch.bfloat16))
    assert not halved.on_kernel()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    assert torch.equal(halved(x), x @ halved.weight_t + halved.bias)
