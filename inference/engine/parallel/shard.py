"""One rank's part of a tensor-parallel model: which heads and feed-forward rows it holds, its checkpoint tensors
cut to them, and the row-parallel layers that sum the ranks' partial outputs.

Megatron-LM's split of a decoder layer, the one vLLM and SGLang serve with: q/k/v and gate/up are column-parallel
(each rank computes its own heads, its own rows of the feed-forward, from the whole input), o_proj and down_proj are
row-parallel (each rank multiplies its slice of their input and the ranks' partial outputs are summed: one
all-reduce after each). Attention needs no communication in between, since a rank's query heads attend over its own
KV heads only: with the heads cut in contiguous runs, query head h's KV head h // (H / Hkv) is on the same rank.
The embedding, the norms and the output head are whole on every rank. A rank's model is the model of a smaller
config (`shard_config`: H / N query heads, Hkv / N KV heads, ffn / N feed-forward rows), so the transformer, the
attention and the KV cache, which a rank holds for its own KV heads, are the ones a whole model runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from inference.engine.errors import LoadError
from inference.engine.model.config import ModelConfig
from inference.engine.model.layout import model_tensors

# The linear layers whose output rows are cut (column-parallel) and whose input columns are (row-parallel).
COLUMN_PARALLEL = ("attention.wqkv", "feed_forward.w13")
ROW_PARALLEL = ("attention.wo", "feed_forward.w2")


class AllReduce(Protocol):
    def all_reduce(self, tensor: torch.Tensor) -> None: ...


@dataclass(frozen=True, slots=True)
class Shard:
    """Which part of a tensor-parallel model a load builds: rank `rank` of `ranks`, summing over `group`."""

    rank: int
    ranks: int
    group: AllReduce


class SplitRefused(LoadError, ValueError):
    """A split the model or the load's other options cannot take: the operator's request to change (the worker
    answers bad_checkpoint, 400), not a failure."""


def split_problem(config: ModelConfig, ranks: int) -> str | None:
    """Why a model of `config` cannot be cut into `ranks` equal parts, or None when it can."""
    sizes = {
        "attention heads": config.num_heads,
        "KV heads": config.num_kv_heads,
        "feed-forward rows (intermediate_size)": config.intermediate_size,
    }
    uneven = [f"{count} {what}" for what, count in sizes.items() if count % ranks]
    return f"the model's {' and '.join(uneven)} do not divide by tensor_parallel {ranks}" if uneven else None


def check_split(path: str | Path, config: ModelConfig, ranks: int) -> None:
    """SplitRefused naming what does not divide, before any weight is read."""
    if (problem := split_problem(config, ranks)) is not None:
        raise SplitRefused(Path(path), problem)


def shard_config(config: ModelConfig, ranks: int) -> ModelConfig:
    """The config of one rank's model: its share of the heads and of the feed-forward rows."""
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // ranks,
        num_kv_heads=config.num_kv_heads // ranks,
        intermediate_size=config.intermediate_size // ranks,
    )


def _cut_dims(config: ModelConfig) -> dict[str, int]:
    """Each Hugging Face tensor that is cut, by name, with the dim it is cut along (0: rows, 1: columns)."""
    cut = {}
    for tensor in model_tensors(config):
        module = tensor.module.partition(".")[2].partition(".")[2]  # "layers.3.attention.wqkv" -> "attention.wqkv"
        for part in tensor.parts:
            if module in COLUMN_PARALLEL and not part.copies:  # q/k norms: one row each, every rank the same
                cut[part.hf] = 0
            elif module in ROW_PARALLEL:
                cut[part.hf] = 1
    return cut


class ShardTensors(Mapping[str, torch.Tensor]):
    """A checkpoint's Hugging Face tensors as rank `rank` of `ranks` holds them: the cut ones cut to its part (a copy
    of its own, so the whole tensor is freed), the others as they are. Each is asked of `tensors` only when asked
    for here (a GGUF checkpoint decodes each tensor when first asked for)."""

    def __init__(self, config: ModelConfig, tensors: Mapping[str, torch.Tensor], rank: int, ranks: int):
        self.tensors, self.rank, self.ranks = tensors, rank, ranks
        self.cut = _cut_dims(config)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.tensors[name]
        dim = self.cut.get(name)
        if dim is None:
            return tensor
        part = tensor.chunk(self.ranks, dim=dim)[self.rank]
        return torch.empty_like(part, memory_format=torch.contiguous_format).copy_(part)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)


class RowParallel(nn.Module):
    """A row-parallel linear layer: this rank's partial product, summed over the ranks in place (the all-reduce).
    The result is the whole layer's output on every rank, up to the order of the float sums."""

    def __init__(self, inner: nn.Module, group: AllReduce):
        super().__init__()
        self.inner = inner
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, in / N] -> [T, out]
        out = self.inner.forward(x)
        self.group.all_reduce(out)
        return out


def make_row_parallel(model: nn.Module, group: AllReduce) -> None:
    """Wraps every layer's o_proj and down_proj (in whatever form the load gave them) in a RowParallel."""
    for block in model.layers:
        block.attention.wo = RowParallel(block.attention.wo, group)
        block.feed_forward.w2 = RowParallel(block.feed_forward.w2, group)
