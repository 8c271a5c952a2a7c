"""How many threads a CPU model's steps use: torch's intra-op threads and the C matmul kernel's elastic pool
(kernels/_elastic_pool.h), chosen per model by the worker.

A small model steps on one thread: its ops take microseconds, less than waking and joining a second thread costs
(docs/performance-log.md measured it). What counts as small is the parameter count, not the bytes: a quantized
file of a large model is small in bytes, but its matmuls still have the large model's rows to share.

A model whose large linear layers all run on the C kernel (GGUF Q4_0 and Q8_0 kept as blocks, float32 where the CPU
has AVX-512) shares its work through the kernel's elastic pool alone, with torch left on one thread: torch's OpenMP
threads split each op in equal shares and meet at a barrier, so on cores shared with the serving edge and its
clients a preempted thread stalls every op, and two pools would spin against each other. Other models use torch's
threads (their matmuls are torch's) and the pool for whatever kernel layers they have. docs/performance.md has the
measurements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from inference.engine import kernels
from inference.engine.kv_budget import parameter_count
from inference.engine.model.config import ModelConfig

SMALL_MODEL_PARAMETERS = 16 * 2**20


class StepThreads(NamedTuple):
    torch: int  # torch's intra-op threads
    kernels: int  # the C matmul kernel's pool


def choose_step_threads(config: ModelConfig, torch_matmuls: bool, threads: int) -> StepThreads:
    """The threads a model of that shape steps with on a CPU worker that may use `threads`; `torch_matmuls`: some of
    its large linear layers multiply with torch's ops (loading.torch_matmuls)."""
    if parameter_count(config) < SMALL_MODEL_PARAMETERS:
        return StepThreads(torch=1, kernels=1)
    return StepThreads(torch=threads if torch_matmuls else 1, kernels=threads)


def apply_step_threads(threads: StepThreads) -> None:
    """Makes the next step run with `threads`."""
    if torch.get_num_threads() != threads.torch:
        torch.set_num_threads(threads.torch)
    kernels.set_threads(threads.kernels)
