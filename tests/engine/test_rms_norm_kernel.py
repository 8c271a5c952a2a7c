"""The C RMSNorm (model/rms_norm.py) computes torch's rms_norm, on one row and on enough rows to run threaded, and
the model's RMSNorm goes through it for float32 on the CPU."""

import pytest
import torch

from inference.engine.model import rms_norm as kernel
from inference.engine.model.transformer import RMSNorm


@pytest.mark.parametrize("rows", [1, 3, 200])
def test_the_kernel_computes_torchs_rms_norm(rows: int):
    assert kernel.KERNEL is not None, "the C extension was not built"
    torch.manual_seed(rows)
    x, weight = 3 * torch.randn(rows, 768), torch.randn(768)
    want = torch.rms_norm(x, (768,), weight, 1e-5)
    got = kernel.rms_norm(x, weight, 1e-5)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_a_non_contiguous_input_is_read_as_its_values():
    x, weight = torch.randn(768, 4).t(), torch.randn(768)
    assert torch.allclose(kernel.rms_norm(x, weight, 1e-6), torch.rms_norm(x, (768,), weight, 1e-6), atol=1e-6)


def test_the_models_norm_calls_the_kernel(monkeypatch: pytest.MonkeyPatch):
    calls = []
    real = kernel.KERNEL

    class Counting:
        @staticmethod
        def rms_norm(*args):
            calls.append(args)
            return real.rms_norm(*args)

    monkeypatch.setattr(kernel, "KERNEL", Counting)
    norm = RMSNorm(64, 1e-5)
    x = torch.randn(2, 5, 64)
    assert torch.allclose(norm(x), torch.rms_norm(x, (64,), norm.weight, 1e-5), atol=1e-6)
    assert len(calls) == 1
