"""Which threads a CPU worker steps a model with (step_threads.py): one for a small model, whatever its format; a
model whose large linear layers all run on the C kernel shares its work through the kernel's pool alone, torch on
one thread; a large model with torch matmuls uses torch's threads too."""

import dataclasses

import torch

from inference.engine.execution.step_threads import StepThreads, apply_step_threads, choose_step_threads
from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.kv_budget import read_config
from inference.engine.loaders.loading import torch_matmuls
from inference.engine.model.transformer import cpu_linears
from inference.engine.quant import block_quant
from tests.engine.kernel_marks import needs_block_kernel


def _config_85m(stories_hf_dir):
    """bench/random_model.py's 85M Llama: 12 layers of hidden 768, FFN 2048 (its Q4_0 file weighs ~50 MB)."""
    config = read_config(stories_hf_dir)
    return dataclasses.replace(
        config, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=12, head_dim=64
    )


def test_a_small_model_steps_on_one_thread(stories_hf_dir):
    config = read_config(stories_hf_dir)
    assert choose_step_threads(config, True, 2) == StepThreads(torch=1, kernels=1)
    assert choose_step_threads(config, False, 2) == StepThreads(torch=1, kernels=1)


def test_a_large_model_on_the_c_kernel_steps_on_its_pool_alone(stories_hf_dir):
    """Counted in parameters, not bytes: the 85M model's Q4_0 form is small in bytes but has the rows to share."""
    config = _config_85m(stories_hf_dir)
    assert choose_step_threads(config, False, 2) == StepThreads(torch=1, kernels=2)
    assert choose_step_threads(config, False, 4) == StepThreads(torch=1, kernels=4)


def test_a_large_model_with_torch_matmuls_uses_torchs_threads(stories_hf_dir):
    assert choose_step_threads(_config_85m(stories_hf_dir), True, 2) == StepThreads(torch=2, kernels=2)


def test_which_layers_multiply_with_torch():
    """Block layers and FloatLinear run on the C kernel; an int8 or oneDNN-packed layer, or a plain nn.Linear (an
    attachable load), on torch's threads."""
    blocks = torch.nn.Sequential(block_quant.Q4_0Linear(torch.nn.Linear(768, 512)))
    assert not torch_matmuls(blocks)
    floats = cpu_linears(torch.nn.Sequential(torch.nn.Linear(768, 512), torch.nn.Linear(16, 16)), float32=True)
    assert torch_matmuls(floats) is not matmul_kernel.float_kernel_runs()
    assert torch_matmuls(torch.nn.Sequential(torch.nn.Linear(768, 512)))


@needs_block_kernel
def test_applying_sets_both_pools():
    before = (torch.get_num_threads(), matmul_kernel.KERNEL.threads())
    try:
        apply_step_threads(StepThreads(torch=1, kernels=3))
        assert (torch.get_num_threads(), matmul_kernel.KERNEL.threads()) == (1, 3)
    finally:
        apply_step_threads(StepThreads(torch=before[0], kernels=before[1]))
