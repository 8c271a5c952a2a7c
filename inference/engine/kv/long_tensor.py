"""Python ints as an int64 tensor: the token ids and KV indices a step builds as lists (kv_cache.py, runner.py).

`torch.tensor` of a list of ints costs several times more than the step of a small model spends on most of its
ops, and a step makes a few of them (docs/performance.md); on a CPU an array's buffer taken as the tensor's memory
costs a fraction of that."""

from __future__ import annotations

import array

import torch


def long_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """`values` as a 1-D int64 tensor on `device`; on a CPU its memory is an array's, which the tensor keeps alive."""
    if device.type != "cpu" or not values:
        return torch.tensor(values, dtype=torch.long, device=device)
    return torch.frombuffer(array.array("q", values), dtype=torch.long)
