"""A step through the model's eager forward over the KV cache: what the runner runs when no decode graph or plan
serves the step, and what the decode graphs' warm-up fills its rows with. Below both runner.py and compiled_step.py,
which share it."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from inference.engine.kv.kv_cache import CacheView, KVCache
from inference.engine.kv.long_tensor import long_tensor
from inference.engine.model.transformer import Transformer


def attention_backends(device: torch.device) -> contextlib.AbstractContextManager:
    """The scaled-dot-product-attention kernels a runner's forward passes may use on `device`: on CUDA, any but
    cuDNN's. cuDNN builds a plan the first time it sees a shape, and the attended length of a decode step (or a
    prompt) is a new shape almost every step, so an eager decode spent nearly all its time building plans
    (docs/performance.md, "GPU check"). A captured CUDA graph keeps the kernels it was captured with."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def eager_step(
    model: Transformer,
    cache: KVCache,
    prefills: list[tuple[int, list[int]]],
    decode_tokens: list[int],
    views: list[CacheView],
    all_logits: frozenset[int],
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward pass over the step's groups (`views`: each prefill chunk's, then the decode rows'), writing their
    KV (the caller advances the slots): float32 logits of each chunk's last position [V] (every position's, [S, V],
    for `i in all_logits`), and of the decode rows [D, V]."""
    device = cache.device
    tokens = long_tensor([t for _, ids in prefills for t in ids] + decode_tokens, device)
    select, start = [], 0  # the positions whose logits are returned
    for i, (_, ids) in enumerate(prefills):
        select += range(start, start + len(ids)) if i in all_logits else [start + len(ids) - 1]
        start += len(ids)
    select += range(start, start + len(decode_tokens))
    every = len(select) == len(tokens)  # a decode-only step (or all logits asked for): no selection
    chosen = None if every else long_tensor(select, device)
    with attention_backends(device):
        logits = model(tokens, cache, views, select=chosen).float()
    chunks, start = [], 0
    for i, (_, ids) in enumerate(prefills):
        count = len(ids) if i in all_logits else 1
        chunks.append(logits[start : start + count] if i in all_logits else logits[start])
        start += count
    return chunks, logits[start:]


def prefill_one_token(model: Transformer, cache: KVCache, slots: list[int], token_id: int) -> None:
    """Appends `token_id` to each of the (empty) slots in one eager pass: rows a decode step can start from."""
    for slot in slots:
        cache.check_room(slot, 1)
    prefills = [(slot, [token_id]) for slot in slots]
    eager_step(model, cache, prefills, [], [cache.view([slot], 1) for slot in slots], frozenset())
    for slot in slots:
        cache.advance(slot, [token_id])
