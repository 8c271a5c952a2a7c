"""int8 linear layers: a smaller model whose logits and greedy tokens stay close to the float model's.

Measured on stories260K (logits up to ~19 in magnitude), with 8-bit activations (VNNI CPUs) / 7-bit (others): max abs
difference 0.82 / 1.19, relative (Frobenius) 2.3% / 3.4%, argmax equal at every prompt position, the first 57 greedy
tokens identical. On a random 2-layer qwen2-style model: relative 6.9% / 12.8%. The bounds leave about 1.5x headroom.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.engine.execution.runner import ModelRunner
from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.kernels.matmul import KERNEL
from inference.engine.loaders.build import build_model
from inference.engine.loaders.loading import linear_formats, load_model
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import expected_hf_shapes
from inference.engine.model.transformer import Transformer
from inference.engine.quant.quantize import REDUCE_RANGE, WeightOnlyInt8Linear, quantize_linears
from tests.greedy import greedy

# (max abs, relative) on stories260K and relative on the random model, for 8-bit or 7-bit activations
STORIES_MAX_ABS, STORIES_REL, RANDOM_REL = (2.0, 0.05, 0.2) if REDUCE_RANGE else (1.2, 0.035, 0.1)
PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317]


def random_config(**fields) -> ModelConfig:
    """A 2-layer model with 4 heads over 2 KV heads, a 300-token vocabulary and a 64-position window; `fields` give
    the rest."""
    shared = {"vocab_size": 300, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64}
    return ModelConfig(**shared, tie_word_embeddings=False, **fields)


def random_weights(config: ModelConfig, scale: float) -> dict[str, torch.Tensor]:
    """Random Hugging Face weights for `config`: norms around 1, the rest `scale` times a standard normal."""
    return {
        name: torch.randn(shape) * (1.0 if "norm" in name else scale)
        for name, shape in expected_hf_shapes(config).items()
    }


@pytest.fixture(scope="module")
def float_and_int8(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=1), load_model(stories_hf_dir, max_concurrent=1, quantize=True)


def test_stories260k_int8_logits_stay_close(float_and_int8):
    float_logits, int8_logits = (greedy(m.runner, PROMPT, 1, all_logits=True).prompt_logits for m in float_and_int8)
    diff = int8_logits - float_logits
    assert diff.abs().max().item() < STORIES_MAX_ABS
    assert (diff.norm() / float_logits.norm()).item() < STORIES_REL
    assert torch.equal(int8_logits.argmax(-1), float_logits.argmax(-1))


def test_stories260k_int8_greedy_tokens_mostly_equal(float_and_int8):
    float_tokens, int8_tokens = (greedy(m.runner, PROMPT[:5], 40).tokens for m in float_and_int8)
    assert sum(a == b for a, b in zip(float_tokens, int8_tokens, strict=True)) >= 35


def test_int8_model_is_smaller_and_has_no_float_linears(float_and_int8):
    float_model, int8_model = float_and_int8
    assert not any(isinstance(m, nn.Linear) for m in int8_model.runner.model.modules())
    # stories260K is mostly embedding (kept in float32); the linear layers shrink 4x
    assert int8_model.weight_bytes < 0.45 * float_model.weight_bytes


def test_int8_with_qkv_bias_and_qk_norm(tmp_path):
    torch.manual_seed(0)
    config = random_config(
        architecture="qwen2",
        hidden_size=128,
        intermediate_size=256,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        attention_bias=True,
        qk_norm=True,
    )
    tensors = random_weights(config, 0.1)
    logits = []
    for quantize in (False, True):
        model = build_model(config, tensors, context_window=64)
        if quantize:
            quantize_linears(model)
        runner = ModelRunner(model, max_concurrent=1, context_window=64)
        logits.append(greedy(runner, list(range(10, 30)), 1, all_logits=True).prompt_logits)
    assert ((logits[1] - logits[0]).norm() / logits[0].norm()).item() < RANDOM_REL


@pytest.mark.skipif(KERNEL is None, reason="the block kernel was not built: every layer is int8")
def test_layers_the_block_kernel_takes_become_q8_0_blocks(monkeypatch):
    """A llama 256 wide: every linear layer (input features a multiple of 256) becomes Q8_0 blocks, the decode plan
    serves it, and it is closer to the float model than int8 per channel (measured 2.9% against 5.3%)."""
    torch.manual_seed(0)
    config = random_config(
        architecture="llama", hidden_size=256, intermediate_size=512, head_dim=64, rms_norm_eps=1e-5, rope_theta=1e4
    )
    tensors = random_weights(config, 0.05)

    def served(quantize: bool) -> tuple[Transformer, ModelRunner, torch.Tensor]:
        model = build_model(config, tensors, context_window=64, quantize=quantize)
        runner = ModelRunner(model, max_concurrent=1, context_window=64)
        logits = greedy(runner, list(range(10, 30)), 1, all_logits=True).prompt_logits
        return model, runner, logits

    _, _, reference = served(False)
    blocks, runner, q8_0 = served(True)
    assert linear_formats(blocks) == {"q8_0": 2 * 4 + 1}  # four per layer and the output head
    assert runner.plan is not None
    monkeypatch.setattr(matmul_kernel, "KERNEL", None)  # a build without the kernel: int8 per channel
    per_channel, _, int8 = served(True)
    assert linear_formats(per_channel) == {"int8": 9}
    q8_0_error, int8_error = (((got - reference).norm() / reference.norm()).item() for got in (q8_0, int8))
    assert q8_0_error < 0.04 and q8_0_error < int8_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_only_int8_linear_matches_float(dtype):
    """The non-CPU path (int8 weights widened per call), checked here on CPU."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 96, bias=True).to(dtype)
    x = torch.randn(3, 5, 256, dtype=dtype)
    expected = linear(x).float()
    got = WeightOnlyInt8Linear(linear)(x)
    assert got.dtype == dtype and got.shape == (3, 5, 96)
    assert ((got.float() - expected).norm() / expected.norm()).item() < 0.02
