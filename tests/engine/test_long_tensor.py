"""long_tensor: the int lists a step builds (token ids, KV indices) as int64 tensors, on a CPU through an array's
buffer (kv/long_tensor.py)."""

from __future__ import annotations

import gc

import torch

from inference.engine.kv.long_tensor import long_tensor


def test_ints_become_the_same_int64_tensor_as_torch_makes_and_outlive_their_list():
    values = [0, 5, -3, 2**40, 511]
    made = [long_tensor(list(values), torch.device("cpu")) for _ in range(50)]
    _ = [list(range(1000)) for _ in range(200)]  # memory churn: a freed buffer would be reused here
    gc.collect()
    for tensor in made:
        assert tensor.dtype == torch.long and tensor.shape == (5,)
        assert torch.equal(tensor, torch.tensor(values))
    assert torch.equal(long_tensor([], torch.device("cpu")), torch.empty(0, dtype=torch.long))
