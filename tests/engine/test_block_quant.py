"""The Q4_0 block kernel (model/block_quant.py, _block_matmul.c): a Q4_0 file's blocks come back exactly from their
float32 expansion, and the kernel's products are the exact block sums of the quantized activations and weights,
for any number of rows and output features (its tiles of 4 x 2 and 1 x 4 and every remainder)."""

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from inference.engine.model.block_quant import BLOCK, KERNEL, Q4_0Linear, decode_q4_0, encode_q4_0

Q4_0 = gguf.GGMLQuantizationType.Q4_0


def _q4_0_file_values(rng: np.random.Generator, rows: int, cols: int) -> tuple[torch.Tensor, np.ndarray]:
    """A weight written as Q4_0 by the gguf package: its float32 expansion and the file's per-block scales."""
    raw = gguf.quants.quantize((0.05 * rng.standard_normal((rows, cols))).astype(np.float32), Q4_0)
    expanded = gguf.quants.dequantize(raw, Q4_0)
    scales = raw.reshape(rows, cols // BLOCK, -1)[..., :2].copy().view(np.float16)[..., 0]
    return torch.from_numpy(np.ascontiguousarray(expanded)), scales.astype(np.float32)


def test_a_q4_0_files_blocks_are_found_again_exactly():
    weight, file_scales = _q4_0_file_values(np.random.default_rng(0), 48, 512)
    codes, scales = encode_q4_0(weight)
    assert codes.dtype == torch.uint8 and codes.shape == (48, 256)
    assert scales.dtype == torch.float16 and np.array_equal(scales.float().numpy(), file_scales)
    assert torch.equal(decode_q4_0(codes, scales), weight)


def _reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x quantized as the kernel does (8 bits, a scale per 32 values, ties to even) times the weight, in float64."""
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, 0.0)
    quantized = (torch.round(blocks * inverse) * (amax / 127.0)).reshape(x.shape)
    return (quantized.double() @ weight.double().T).float()


def kernels() -> list[str]:
    assert KERNEL is not None, "the C extension was not built"
    return KERNEL.available()


@pytest.fixture(params=kernels())
def kernel(request):
    """Each implementation this CPU can run (VNNI, AVX2, portable C) in turn."""
    chosen = KERNEL.kernel_name()
    KERNEL.select(request.param)
    yield request.param
    KERNEL.select(chosen)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("out_features", [6, 8, 13])
def test_the_kernel_computes_the_quantized_product(kernel: str, rows: int, out_features: int):
    torch.manual_seed(rows * 100 + out_features)
    weight, _ = _q4_0_file_values(np.random.default_rng(out_features), out_features, 768)
    linear = nn.Linear(768, out_features, bias=True)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = Q4_0Linear(linear)
    x = torch.randn(rows, 768)
    x[0, :BLOCK] = 0  # a block of zeros: scale 0, no division by it
    got = layer(x)
    want = _reference(x, weight) + linear.bias.detach()
    assert got.shape == (rows, out_features)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # and close to the float product: the activations' 8 bits are the only rounding
    exact = x @ weight.T + linear.bias.detach()
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()


def test_leading_dimensions_are_kept():
    linear = nn.Linear(256, 16, bias=False)
    layer = Q4_0Linear(linear)
    x = torch.randn(2, 3, 256)
    assert torch.allclose(layer(x), layer(x.reshape(6, 256)).reshape(2, 3, 16))
