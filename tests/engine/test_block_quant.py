"""The block kernel (quant/block_quant.py, _matmul.c): a Q4_0 or Q8_0 file's blocks come back exactly from
their float32 expansion, a K-quant's (Q4_K, Q5_K, Q6_K) or a Q5_0, Q4_1 or Q5_1 file's from its bytes, and the
kernel's products are the exact block sums of the quantized activations and weights, for each format, any number
of rows and output features (its tiles of 4 x 2 and 1 x 4 and every remainder), rows padded to whole super-blocks,
on every implementation the CPU runs."""

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from inference.engine.kernels.matmul import KERNEL
from inference.engine.quant.block_codecs import (
    BLOCK,
    decode_q4_0,
    decode_q4_1,
    decode_q4_k,
    decode_q5_0,
    decode_q5_1,
    decode_q5_k,
    decode_q6_k,
    decode_q8_0,
    encode_q4_0,
    encode_q4_1_blocks,
    encode_q4_k,
    encode_q5_0_blocks,
    encode_q5_1_blocks,
    encode_q5_k,
    encode_q6_k,
    encode_q8_0,
)
from inference.engine.quant.block_quant import (
    Q4_0Linear,
    Q4_1Linear,
    Q4_KLinear,
    Q5_0Linear,
    Q5_1Linear,
    Q5_KLinear,
    Q6_KLinear,
    Q8_0Linear,
)
from inference.engine.quant.gguf_dequant import dequantize
from tests.engine.kernel_marks import needs_block_kernel
from tests.engine.test_gguf_quant import encode as random_blocks

Q = gguf.GGMLQuantizationType
FORMATS = {
    "Q4_0": (Q.Q4_0, Q4_0Linear, encode_q4_0, decode_q4_0),
    "Q8_0": (Q.Q8_0, Q8_0Linear, encode_q8_0, decode_q8_0),
}


def _file_values(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> tuple[torch.Tensor, np.ndarray]:
    """A weight written as `qtype` by the gguf package: its float32 expansion and the file's per-block scales."""
    raw = gguf.quants.quantize((0.05 * rng.standard_normal((rows, cols))).astype(np.float32), qtype)
    expanded = gguf.quants.dequantize(raw, qtype)
    scales = raw.reshape(rows, cols // BLOCK, -1)[..., :2].copy().view(np.float16)[..., 0]
    return torch.from_numpy(np.ascontiguousarray(expanded)), scales.astype(np.float32)


@pytest.mark.parametrize("name", FORMATS)
def test_a_files_blocks_are_found_again_exactly(name: str):
    qtype, _, encode, decode = FORMATS[name]
    weight, file_scales = _file_values(np.random.default_rng(0), 48, 512, qtype)
    codes, scales = encode(weight)
    assert codes.shape == (48, 256 if name == "Q4_0" else 512)
    assert codes.dtype == (torch.uint8 if name == "Q4_0" else torch.int8)
    assert scales.dtype == torch.float16 and np.array_equal(scales.float().numpy(), file_scales)
    assert torch.equal(decode(codes, scales), weight)


def _reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x quantized as the kernel does (8 bits, a scale per 32 values, ties to even) times the weight, in float64."""
    blocks = x.reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(amax > 0, 127.0 / amax, 0.0)
    quantized = (torch.round(blocks * inverse) * (amax / 127.0)).reshape(x.shape)
    return (quantized.double() @ weight.double().T).float()


def kernels() -> list[str]:
    return [] if KERNEL is None else KERNEL.available()


@pytest.fixture(params=kernels())
def kernel(request):
    """Each implementation this CPU can run (VNNI, AVX2, portable C) in turn."""
    chosen = KERNEL.kernel_name()
    KERNEL.select(request.param)
    yield request.param
    KERNEL.select(chosen)


@needs_block_kernel
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("out_features", [6, 8, 13])
@pytest.mark.parametrize("in_features", [768, 640], ids=["whole", "padded"])  # 640: rows padded to 768
def test_the_kernel_computes_the_quantized_product(
    kernel: str, name: str, rows: int, out_features: int, in_features: int
):
    qtype, layer_class, _, _ = FORMATS[name]
    torch.manual_seed(rows * 100 + out_features)
    weight, _ = _file_values(np.random.default_rng(out_features), out_features, in_features, qtype)
    if name == "Q8_0":
        weight[0, :BLOCK] = -weight[0, :BLOCK].abs()  # a block whose codes reach -127: the sign trick's edge
    linear = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = layer_class(linear)
    x = torch.randn(rows, in_features)
    x[0, :BLOCK] = 0  # a block of zeros: scale 0, no division by it
    got = layer(x)
    want = _reference(x, weight) + linear.bias.detach()
    assert got.shape == (rows, out_features)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # and close to the float product: the activations' 8 bits are the only rounding
    exact = x @ weight.T + linear.bias.detach()
    assert (got - exact).abs().max() <= 0.02 * exact.abs().max()


# The K-quants kept from the file's bytes: (layer, encode, decode, code bytes per value, scale bytes per super-block,
# the super-block scales that put random blocks at a trained model's scale).
K_FORMATS = {
    "Q4_K": (Q4_KLinear, encode_q4_k, decode_q4_k, 0.5, 24, (1e-4, 4e-4)),
    "Q5_K": (Q5_KLinear, encode_q5_k, decode_q5_k, 0.625, 24, (5e-5, 2e-4)),
    "Q6_K": (Q6_KLinear, encode_q6_k, decode_q6_k, 0.75, 20, (6.2e-5, 1.2e-4)),
}


def _k_file(name: str, seed: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes of a K-quant tensor [rows, bytes per row] and their float32 expansion."""
    qtype = Q[name]
    blocks, _ = random_blocks(np.random.default_rng(seed), qtype, (rows, cols), K_FORMATS[name][5])
    return torch.from_numpy(blocks).reshape(rows, -1), dequantize(blocks, qtype, (rows, cols))


@pytest.mark.parametrize("name", K_FORMATS)
def test_k_quant_bytes_give_the_files_expansion_exactly(name: str):
    _, encode, decode, code_bytes, scale_bytes, _ = K_FORMATS[name]
    stored, weight = _k_file(name, 0, 48, 512)
    codes, scales = encode(stored)
    assert codes.shape == (48, int(512 * code_bytes))
    assert scales.shape == (48, 2, scale_bytes)  # per super-block: d, dmin, scales, mins (Q6_K: d, scales)
    assert torch.equal(decode(codes, scales), weight)


@needs_block_kernel
@pytest.mark.parametrize("name", K_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("out_features", [6, 8, 13])
def test_the_kernel_computes_the_k_quant_product(kernel: str, name: str, rows: int, out_features: int):
    torch.manual_seed(rows * 100 + out_features)
    stored, weight = _k_file(name, out_features, out_features, 768)
    linear = nn.Linear(768, out_features, bias=True)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = K_FORMATS[name][0](linear, stored)
    x = torch.randn(rows, 768)
    x[0, :BLOCK] = 0
    got = layer(x)
    want = _reference(x, weight) + linear.bias.detach()
    assert got.shape == (rows, out_features)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


# The legacy types kept from the file's bytes: (layer, encode, decode, code bytes per 256 values, scale bytes per 256).
LEGACY_FORMATS = {
    "Q5_0": (Q5_0Linear, encode_q5_0_blocks, decode_q5_0, 160, 16),
    "Q4_1": (Q4_1Linear, encode_q4_1_blocks, decode_q4_1, 128, 32),
    "Q5_1": (Q5_1Linear, encode_q5_1_blocks, decode_q5_1, 160, 32),
}


def _legacy_file(name: str, seed: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bytes of a tensor the gguf package writes [rows, bytes per row] and their float32 expansion."""
    values = (0.05 * np.random.default_rng(seed).standard_normal((rows, cols))).astype(np.float32)
    raw = gguf.quants.quantize(values, Q[name])
    stored = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1))
    return stored, dequantize(stored, Q[name], (rows, cols))


@pytest.mark.parametrize("name", LEGACY_FORMATS)
@pytest.mark.parametrize("in_features", [512, 640], ids=["whole", "padded"])
def test_legacy_bytes_give_the_files_expansion_exactly_in_its_bytes(name: str, in_features: int):
    _, encode, decode, code_bytes, scale_bytes = LEGACY_FORMATS[name]
    stored, weight = _legacy_file(name, 0, 48, in_features)
    codes, scales = encode(stored)
    supers = -(-in_features // 256)
    assert codes.shape[0] == scales.shape[0] == 48
    assert codes[0].numel() == supers * code_bytes and scales[0].numel() * 2 == supers * scale_bytes
    assert torch.equal(decode(codes, scales, in_features), weight)


@needs_block_kernel
@pytest.mark.parametrize("name", LEGACY_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("out_features", [6, 8, 13])
@pytest.mark.parametrize("in_features", [768, 640], ids=["whole", "padded"])
def test_the_kernel_computes_the_legacy_product(kernel: str, name: str, rows: int, out_features: int, in_features: int):
    torch.manual_seed(rows * 100 + out_features)
    stored, weight = _legacy_file(name, out_features, out_features, in_features)
    linear = nn.Linear(in_features, out_features, bias=True)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = LEGACY_FORMATS[name][0](linear, stored)
    x = torch.randn(rows, in_features)
    x[0, :BLOCK] = 0
    got = layer(x)
    want = _reference(x, weight) + linear.bias.detach()
    assert got.shape == (rows, out_features)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@needs_block_kernel
@pytest.mark.parametrize("layer_class", [Q4_0Linear, Q8_0Linear])
def test_leading_dimensions_are_kept(layer_class):
    linear = nn.Linear(256, 16, bias=False)
    layer = layer_class(linear)
    x = torch.randn(2, 3, 256)
    assert torch.allclose(layer(x), layer(x.reshape(6, 256)).reshape(2, 3, 16))


@needs_block_kernel
@pytest.mark.parametrize("rows", [1, 3, 50])
def test_every_thread_count_computes_the_same_product(rows: int):
    """The pool's chunks (activation rows to quantize, output rows to compute) cover every row exactly once, however
    many threads claim them: the product is the one-thread product bit for bit, call after call (1003 outputs: a
    last chunk of 3 rows; 50 rows: quantized in parallel too)."""
    linear = nn.Linear(768, 1003, bias=False)
    layer = Q4_0Linear(linear)
    x = torch.randn(rows, 768)
    before = KERNEL.threads()
    try:
        KERNEL.set_threads(1)
        alone = layer(x)
        KERNEL.set_threads(3)
        assert KERNEL.threads() == 3
        for _ in range(30):
            assert torch.equal(layer(x), alone)
    finally:
        KERNEL.set_threads(before)
