"""A decoder layer's step is described once (transformer.Block.forward) and every execution of a decode step follows
it: the eager forward, the compiled decode graph and the decode plan decode the same greedy tokens as transformers
for models whose architecture switches are set otherwise than in the other tests (q/k/v bias with a large norm eps
and a tied head, Llama-3 RoPE scaling with another theta, qwen3's per-head q/k norm, which the plan leaves to the
forward)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config, Qwen3Config

from inference.engine import kernels
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from tests.engine.test_model_parity import LLAMA3_ROPE, TINY, hf_logits, write_checkpoint
from tests.greedy import greedy_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # compiled steps run with the threads their graphs were made for

PROMPTS = [[5, 17, 200, 3, 99], [250, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]
STEPS = 20  # the shorter row crosses a block boundary (16 positions)
SWITCHES = {
    "qkv-bias-eps-tied": lambda: Qwen2Config(**{**TINY, "rms_norm_eps": 0.1}, tie_word_embeddings=True),
    "llama3-rope-theta": lambda: LlamaConfig(
        **TINY, tie_word_embeddings=False, rope_parameters={**LLAMA3_ROPE, "rope_theta": 500.0}
    ),
    "qk-norm": lambda: Qwen3Config(**{**TINY, "rms_norm_eps": 0.1}, tie_word_embeddings=False),
}


def decode(runner: ModelRunner) -> tuple[list[list[int]], torch.Tensor]:
    """Both prompts' greedy continuations, decoded together, and every decode step's logits [STEPS, B, V]."""
    return greedy_batch(runner, PROMPTS, STEPS)


@pytest.mark.parametrize("name", list(SWITCHES))
def test_eager_planned_and_compiled_decode_follow_the_one_description(name, tmp_path):
    reference = write_checkpoint(SWITCHES[name](), tmp_path)
    checkpoint = read_hf_dir(tmp_path)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64)
    runner = ModelRunner(model, max_concurrent=2, context_window=64)
    plan, runner.plan = runner.plan, None
    # the plan lowers every switch but qwen3's q/k norm; with the kernels off there is no plan (the forward serves)
    kernels_on = {"block_matmul", "paged_attention", "pointwise"} <= set(kernels.active_kernels())
    assert (plan is None) == (name == "qk-norm" or not kernels_on)

    eager_ids, eager_logits = decode(runner)
    for prompt, ids in zip(PROMPTS, eager_ids, strict=True):  # transformers picks the same tokens
        assert hf_logits(reference, prompt + ids[:-1])[len(prompt) - 1 :].argmax(-1).tolist() == ids

    if plan is not None:
        runner.plan = plan
        planned_ids, planned_logits = decode(runner)
        assert planned_ids == eager_ids and torch.equal(planned_logits, eager_logits)  # bit for bit
        runner.plan = None

    graphs = runner.compile_decode(threads=1, buckets=[2])
    assert graphs.mode == "compiled", graphs.fallback_reason
    compiled_ids, compiled_logits = decode(runner)
    assert graphs.mode == "compiled", graphs.fallback_reason  # every step ran the graph
    assert compiled_ids == eager_ids
    assert (compiled_logits - eager_logits).abs().max() <= 1e-4  # rounding: fused kernels sum in another order
