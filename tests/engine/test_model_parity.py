"""The engine's model against transformers' on random tiny checkpoints of every supported architecture.

Each case writes a real Hugging Face checkpoint with `save_pretrained` and loads it through `read_hf_dir`, so the
loader's naming, fusing and tying are checked along with the forward pass.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from inference.engine import kernels
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from tests.greedy import greedy

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # wavelengths 2*pi*10000^(2i/16) span 6 to 20000: some pairs kept, one blended, the rest slowed down
    "original_max_position_embeddings": 32,
}
CONFIGS = {
    "llama": lambda tied: LlamaConfig(**TINY, tie_word_embeddings=tied),
    "llama3-rope": lambda tied: LlamaConfig(**TINY, tie_word_embeddings=tied, rope_parameters=LLAMA3_ROPE),
    "mistral": lambda tied: MistralConfig(**TINY, tie_word_embeddings=tied, sliding_window=128),
    "qwen2": lambda tied: Qwen2Config(**TINY, tie_word_embeddings=tied),
    "qwen3": lambda tied: Qwen3Config(**TINY, tie_word_embeddings=tied),
}
PROMPTS = [[5, 17, 200, 3, 99], [250, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42]]
NEW_TOKENS = 32


def make_checkpoint(name: str, tied: bool, path) -> AutoModelForCausalLM:
    """A random model of CONFIGS[name] written to `path` (write_checkpoint)."""
    return write_checkpoint(CONFIGS[name](tied), path)


def write_checkpoint(config, path) -> AutoModelForCausalLM:
    """A random model of `config` written to `path`; norms and biases are randomized too, so an execution that
    misses one changes its tokens."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.uniform_(0.5, 1.5)
            elif param_name.endswith("bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return model


def load_runner(path, max_concurrent: int = 4) -> ModelRunner:
    checkpoint = read_hf_dir(path)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=128)
    return ModelRunner(model, max_concurrent=max_concurrent, context_window=128)


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [S, V]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_batched_greedy_decode_match_transformers(name, tied, tmp_path):
    reference = make_checkpoint(name, tied, tmp_path)
    runner = load_runner(tmp_path)
    slots = [runner.allocate_slot() for _ in PROMPTS]

    # the engine: prefill each prompt, then greedy-decode all of them together, each at its own position
    logits = [runner.prefill(slot, prompt, all_logits=True) for slot, prompt in zip(slots, PROMPTS, strict=True)]
    sequences = [prompt + [int(row[-1].argmax())] for prompt, row in zip(PROMPTS, logits, strict=True)]
    for _ in range(NEW_TOKENS - 1):
        step = runner.decode(slots, [seq[-1] for seq in sequences])  # [B, V]
        assert step.dtype == torch.float32
        for i, seq in enumerate(sequences):
            logits[i] = torch.cat([logits[i], step[i : i + 1]])
            seq.append(int(step[i].argmax()))
    assert [runner.slot_length(slot) for slot in slots] == [len(seq) - 1 for seq in sequences]

    # transformers on each whole sequence: same logits at every position, and it would pick the same tokens
    for prompt, seq, engine_logits in zip(PROMPTS, sequences, logits, strict=True):
        expected = hf_logits(reference, seq[:-1])  # [len - 1, V]
        assert (engine_logits - expected).abs().max().item() < 1e-4
        assert expected[len(prompt) - 1 :].argmax(-1).tolist() == seq[len(prompt) :]
        assert len(seq) - len(prompt) == NEW_TOKENS


def test_llama3_rope_scaling_changes_the_model(tmp_path):
    """The scaled frequencies are really used: the same weights without scaling give different logits."""
    make_checkpoint("llama3-rope", False, tmp_path)
    checkpoint = read_hf_dir(tmp_path)
    assert checkpoint.config.rope_scaling is not None
    ids = list(range(1, 60))
    outputs = []
    for config in (checkpoint.config, dataclasses.replace(checkpoint.config, rope_scaling=None)):
        model = build_model(config, checkpoint.tensors, context_window=128)
        runner = ModelRunner(model, max_concurrent=1, context_window=128)
        outputs.append(runner.prefill(runner.allocate_slot(), ids, all_logits=True))
    assert (outputs[0][-1] - outputs[1][-1]).abs().max().item() > 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_close_to_float32(dtype, tmp_path):
    make_checkpoint("qwen3", False, tmp_path)
    checkpoint = read_hf_dir(tmp_path)
    logits = {}
    for model_dtype in (torch.float32, dtype):
        model = build_model(checkpoint.config, checkpoint.tensors, context_window=128, dtype=model_dtype)
        runner = ModelRunner(model, max_concurrent=2, context_window=128)
        slots = [runner.allocate_slot(), runner.allocate_slot()]
        runner.prefill(slots[0], PROMPTS[0])
        runner.prefill(slots[1], PROMPTS[1])
        logits[model_dtype] = runner.decode(slots, [7, 8])
    assert logits[dtype].dtype == torch.float32
    scale = logits[torch.float32].abs().max().item()
    assert (logits[dtype] - logits[torch.float32]).abs().max().item() < 0.05 * scale


def test_stories260k_greedy_generation_matches_transformers(stories_hf_dir):
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(stories_hf_dir)("Once upon a time")["input_ids"]
    assert prompt[0] == 1  # BOS
    reference = AutoModelForCausalLM.from_pretrained(stories_hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :]

    checkpoint = read_hf_dir(stories_hf_dir)
    runner = ModelRunner(
        build_model(checkpoint.config, checkpoint.tensors, context_window=512),
        max_concurrent=1,
        context_window=512,
    )
    assert len(expected) == 40
    assert greedy(runner, prompt, len(expected)).tokens == expected.tolist()


@pytest.mark.skipif(not kernels.ENABLED, reason="this run is torch's path already (PANTHEON_KERNELS=off)")
def test_the_same_parity_holds_on_torchs_path():
    """Every comparison above once more with the C kernels off, as a host without a C compiler runs them: in a process
    of its own, since which kernels run is settled at import (kernels/switch.py)."""
    root = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "not torchs_path"]
    env = {**os.environ, "PANTHEON_KERNELS": "off"}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout and " deselected" in done.stdout
