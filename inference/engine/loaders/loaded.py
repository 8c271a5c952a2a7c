"""`LoadedModel`: what a load hands the worker (loading.py makes it), in a module of its own so that what it holds
(the runner, the trainer's parameter views) and what reads it can import it without importing the loaders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from inference.engine.execution.runner import ModelRunner
from inference.engine.model.config import ModelConfig
from inference.engine.text.tokenizer import Tokenizer
from inference.engine.weights.parameter_views import ParameterViews

if TYPE_CHECKING:
    from inference.engine.parallel.ranks import SplitRanks


@dataclass(slots=True)
class LoadedModel:
    path: Path
    format: str  # "hf" | "gguf"
    config: ModelConfig
    tokenizer: Tokenizer
    runner: ModelRunner
    eos_token_ids: list[int]  # config + generation_config + tokenizer EOS, deduplicated, in that order
    dtype: torch.dtype
    device: torch.device
    quantized: bool  # int8 linear layers
    parameters: ParameterViews | None  # the Hugging Face tensors a trainer attaches to; None unless attachable
    weight_bytes: int  # bytes of the weights held on the device, int8 layers at their int8 size
    weights_version: int  # identifies these weights as loaded (see weights_version)
    linear_formats: dict[str, int]  # the linear layers' in-memory formats (see linear_formats)
    torch_matmuls: bool  # a large weight's matmul runs on torch's threads (see torch_matmuls)
    split: SplitRanks | None = None  # rank 0 of a tensor-parallel split: the other ranks (parallel/ranks.py)
