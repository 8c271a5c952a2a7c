"""The float32 C kernel (`_float_matmul.h`, transformer.py's FloatLinear): the product of every tile shape and
remainder (each row count up to eight has its own tile, more rows go in bands; a K that is no multiple of 8 or 16),
the same bit for bit on any number of threads, and the layer the CPU linears become where the CPU runs it."""

import pytest
import torch
from torch import nn

from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.model.transformer import FloatLinear, PackedLinear, TransposedLinear, cpu_linears
from tests.engine.kernel_marks import needs_float_kernel

needs_kernel = needs_float_kernel


def assert_computes_the_product(layer_class: type[nn.Module], rows: int, out_features: int, in_features: int):
    """A layer of `layer_class` made from a random nn.Linear (with bias) against the float64 product; returns it."""
    torch.manual_seed(rows * 1000 + out_features)
    linear = nn.Linear(in_features, out_features, bias=True)
    layer = layer_class(linear)
    x = torch.randn(rows, in_features)
    got = layer(x)
    want = (x.double() @ linear.weight.double().T + linear.bias.double()).float()
    assert got.shape == (rows, out_features)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    return layer


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 70])
@pytest.mark.parametrize(("out_features", "in_features"), [(13, 100), (24, 768), (37, 2048)])
def test_the_kernel_computes_the_product(rows: int, out_features: int, in_features: int):
    assert_computes_the_product(FloatLinear, rows, out_features, in_features)


@needs_kernel
def test_leading_dimensions_are_kept():
    layer = FloatLinear(nn.Linear(256, 16, bias=False))
    x = torch.randn(2, 3, 256)
    assert torch.equal(layer(x), layer(x.reshape(6, 256)).reshape(2, 3, 16))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 8])
def test_every_thread_count_computes_the_same_product(rows: int):
    layer = FloatLinear(nn.Linear(768, 1003, bias=False))
    x = torch.randn(rows, 768)
    before = matmul_kernel.KERNEL.threads()
    try:
        matmul_kernel.set_threads(1)
        alone = layer(x)
        matmul_kernel.set_threads(3)
        for _ in range(30):
            assert torch.equal(layer(x), alone)
    finally:
        matmul_kernel.set_threads(before)


def test_large_float32_layers_go_to_the_kernel_where_the_cpu_runs_it():
    model = cpu_linears(nn.Sequential(nn.Linear(768, 512), nn.Linear(16, 16)), float32=True)
    large = FloatLinear if matmul_kernel.float_kernel_runs() else PackedLinear
    assert isinstance(model[0], large) and isinstance(model[1], TransposedLinear)
    x = torch.randn(3, 768)
    assert (
        torch.allclose(model[0](x), x @ model[0].weight.T + model[0].bias, atol=1e-5) if large is FloatLinear else True
    )
