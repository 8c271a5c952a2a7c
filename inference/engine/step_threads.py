"""How many threads a CPU model's steps use: torch's intra-op threads and the block kernels' elastic pool
(model/_elastic_pool.h), chosen per model by the worker.

A small model steps on one thread: its ops take microseconds, less than waking and joining a second thread costs
(stories260K served 638 tok/s to one stream on one thread, 279 on two). What counts as small is the parameter count,
not the bytes: a quantized file of a large model is small in bytes, but its matmuls still have the large model's rows
to share.

A model whose every linear layer runs on the block kernel (GGUF Q4_0 and Q8_0 kept as blocks) shares its work
through the kernel's elastic pool alone, with torch left on one thread: torch's OpenMP threads split each op in
equal shares and meet at a barrier, so on cores shared with the serving edge and its clients a preempted thread
stalls every op, and two such pools would spin against each other. Other models use torch's threads (their matmuls
are torch's) and the pool for whatever block layers they have. docs/performance.md has the measurements.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from inference.engine.kv_budget import parameter_count
from inference.engine.model import block_quant
from inference.engine.model.config import ModelConfig

SMALL_MODEL_PARAMETERS = 16 * 2**20
BLOCK_FORMATS = frozenset({"q4_0", "q8_0"})


class StepThreads(NamedTuple):
    torch: int  # torch's intra-op threads
    kernels: int  # the block kernels' pool


def choose_step_threads(config: ModelConfig, linear_formats: dict[str, int], threads: int) -> StepThreads:
    """The threads a model of that shape, whose linear layers take those in-memory formats, steps with on a CPU
    worker that may use `threads`."""
    if parameter_count(config) < SMALL_MODEL_PARAMETERS:
        return StepThreads(torch=1, kernels=1)
    only_blocks = bool(linear_formats) and set(linear_formats) <= BLOCK_FORMATS
    return StepThreads(torch=1 if only_blocks else threads, kernels=threads)


def apply_step_threads(threads: StepThreads) -> None:
    """Makes the next step run with `threads`."""
    if torch.get_num_threads() != threads.torch:
        torch.set_num_threads(threads.torch)
    block_quant.set_threads(threads.kernels)
