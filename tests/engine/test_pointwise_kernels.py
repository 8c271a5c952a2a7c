"""The C row-wise kernels (kernels/pointwise.py) compute what torch's ops compute: RMSNorm, with and without the
residual add before it, and SwiGLU, on one row and on enough rows to run threaded; the model's layers go through
them for float32 on the CPU."""

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kernels import pointwise as kernel
from inference.engine.model.transformer import FeedForward, RMSNorm
from tests.engine.kernel_marks import needs_pointwise_kernel

pytestmark = needs_pointwise_kernel


@pytest.mark.parametrize("rows", [1, 3, 200])
def test_the_kernel_computes_torchs_rms_norm(rows: int):
    assert kernel.KERNEL is not None, "the C extension was not built"
    torch.manual_seed(rows)
    x, weight = 3 * torch.randn(rows, 768), torch.randn(768)
    want = torch.rms_norm(x, (768,), weight, 1e-5)
    got = kernel.rms_norm(x, weight, 1e-5)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


@pytest.mark.parametrize("rows", [1, 200])
def test_the_residual_is_added_into_x_before_the_norm(rows: int):
    torch.manual_seed(rows)
    x, residual, weight = torch.randn(rows, 768), torch.randn(rows, 768), torch.randn(768)
    stream = x + residual
    got = kernel.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(x, stream)  # the stream now holds the sum, as x + residual rounds it
    want = torch.rms_norm(stream, (768,), weight, 1e-5)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_a_non_contiguous_input_is_read_as_its_values():
    x, weight = torch.randn(768, 4).t(), torch.randn(768)
    assert torch.allclose(kernel.rms_norm(x, weight, 1e-6), torch.rms_norm(x, (768,), weight, 1e-6), atol=1e-6)
    with pytest.raises(ValueError, match="contiguous"):  # an in-place add into a copy would be lost
        kernel.rms_norm(x, weight, 1e-6, torch.randn(4, 768))


@pytest.mark.parametrize("width", [2048, 13])  # 13: eight values at a time (AVX2) and a tail of five
@pytest.mark.parametrize("rows", [1, 40])
def test_the_kernel_computes_swiglu(rows: int, width: int):
    torch.manual_seed(rows)
    gate_up = 4 * torch.randn(rows, 2 * width)  # gates far into both tails of the sigmoid
    gate_up[0, :4] = torch.tensor([-100.0, -88.0, 89.0, 100.0])  # past the exponential's float32 range
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernel.swiglu(gate_up), F.silu(gate) * up, rtol=1e-6, atol=1e-6)


def test_the_models_layers_call_the_kernels(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = kernel.KERNEL

    class Counting:
        @staticmethod
        def rms_norm(*args):
            calls.append("rms_norm")
            return real.rms_norm(*args)

        @staticmethod
        def swiglu(*args):
            calls.append("swiglu")
            return real.swiglu(*args)

    monkeypatch.setattr(kernel, "KERNEL", Counting)
    norm = RMSNorm(64, 1e-5)
    x = torch.randn(2, 5, 64)
    assert torch.allclose(norm(x), torch.rms_norm(x, (64,), norm.weight, 1e-5), atol=1e-6)
    ffn = FeedForward(type("Config", (), {"hidden_size": 64, "intermediate_size": 96})())
    h = torch.randn(3, 64)
    gate, up = ffn.w13(h).chunk(2, dim=-1)
    torch.testing.assert_close(ffn(h), ffn.w2(F.silu(gate) * up))
    assert calls == ["rms_norm", "swiglu"]
