"""The prefix cache's host tier on stories260K, float32 on the CPU: a pool of one 128-token window (8 blocks of 16)
whose cached blocks move to host memory when other prompts take the pool. A prompt evicted from the pool comes back
from the tier, as reused tokens, with the logits and the greedy text of a fresh prefill; without a tier the
same sequence reuses nothing; a budget too small for the whole prompt keeps its start and restores only an unbroken
run of it; the budget is never exceeded; a restore the pool has no room for leaves the tier as it was; a budget
larger than the host's free memory is refused before the load."""

from __future__ import annotations

import random

import pytest
import torch

from inference.engine.contract.params import LoadOptions
from inference.engine.errors import KVCacheFull
from inference.engine.execution.runner import ModelRunner
from inference.engine.kv.block_pool import chain_keys
from inference.engine.load_plan import check_host_cache
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir

WINDOW, BLOCK = 128, 16
rng = random.Random(40)
A = [1] + [rng.randrange(3, 512) for _ in range(99)]  # 6 full blocks and 4 positions
B = [2] + [rng.randrange(3, 512) for _ in range(119)]  # 7 full blocks: with A's partial block, the whole pool
A_REUSED = 6 * BLOCK


@pytest.fixture(scope="module")
def transformer(stories_hf_dir):
    checkpoint = read_hf_dir(stories_hf_dir)
    return build_model(checkpoint.config, checkpoint.tensors, context_window=4096)


def block_bytes(transformer) -> int:
    """Keys and values of every layer for one block, float32."""
    config = transformer.config
    return 2 * config.num_layers * config.num_kv_heads * BLOCK * config.head_dim * 4


def new_runner(transformer, host_blocks: int, *, cache_tokens: int = 0) -> ModelRunner:
    return ModelRunner(
        transformer,
        max_concurrent=1,
        context_window=WINDOW,
        cache_tokens=cache_tokens,
        host_cache_bytes=host_blocks * block_bytes(transformer),
    )


def prefill_and_free(runner: ModelRunner, prompt: list[int]) -> None:
    slot = runner.allocate_slot()
    runner.prefill(slot, prompt)
    runner.free_slot(slot)


def generate(runner: ModelRunner, prompt: list[int], tokens: int = 8) -> tuple[int, torch.Tensor, list[int]]:
    """Reuses what the cache holds of `prompt`, prefills the rest and decodes greedily: (tokens reused, the logits
    of the prompt's last token, the ids decoded)."""
    slot = runner.allocate_slot()
    reused = runner.reuse_prefix(slot, prompt)
    logits = runner.prefill(slot, prompt[reused:])
    ids = [int(logits.argmax())]
    for _ in range(tokens - 1):
        ids.append(int(runner.decode([slot], [ids[-1]])[0].argmax()))
    runner.free_slot(slot)
    return reused, logits, ids


def test_a_prompt_evicted_from_the_pool_comes_back_from_the_host_tier_with_the_same_logits_and_text(transformer):
    runner = new_runner(transformer, host_blocks=32)
    prefill_and_free(runner, A)
    prefill_and_free(runner, B)  # takes every block of the pool: A's blocks move to the host tier
    assert all(runner.cache.pool.find(key) is None for key in chain_keys(A, BLOCK))
    assert runner.cache.host.offloaded == 6
    reused, logits, ids = generate(runner, A)
    assert reused == A_REUSED
    assert runner.cache.host.restored == 6
    assert runner.cache.hit_tokens == A_REUSED

    fresh = new_runner(transformer, host_blocks=0)
    fresh_reused, fresh_logits, fresh_ids = generate(fresh, A)  # nothing cached: the whole prompt computed
    assert fresh_reused == 0
    assert torch.allclose(logits, fresh_logits, atol=1e-6, rtol=0)
    assert ids == fresh_ids


def test_without_a_host_tier_the_same_sequence_reuses_nothing(transformer):
    runner = new_runner(transformer, host_blocks=0)
    assert runner.cache.host is None
    prefill_and_free(runner, A)
    prefill_and_free(runner, B)
    assert generate(runner, A)[0] == 0


def test_a_budget_too_small_for_the_prompt_keeps_its_start_and_is_never_exceeded(transformer):
    runner = new_runner(transformer, host_blocks=3)
    host = runner.cache.host
    budget = 3 * block_bytes(transformer)
    assert host._store.nbytes <= budget
    prefill_and_free(runner, A)
    prefill_and_free(runner, B)  # A's six blocks pass through a tier of three: its last ones are dropped first
    assert host.offloaded == 6
    assert host.bytes_used == budget
    reused, logits, ids = generate(runner, A)
    assert reused == 3 * BLOCK
    assert host.restored == 3
    assert host.bytes_used <= budget
    _, fresh_logits, fresh_ids = generate(new_runner(transformer, host_blocks=0), A)
    assert torch.allclose(logits, fresh_logits, atol=1e-6, rtol=0)
    assert ids == fresh_ids


def test_a_budget_smaller_than_a_block_keeps_nothing(transformer):
    runner = ModelRunner(transformer, max_concurrent=1, context_window=WINDOW, host_cache_bytes=1000)
    assert runner.cache.host.capacity == 0
    prefill_and_free(runner, A)
    prefill_and_free(runner, B)
    assert (runner.cache.host.offloaded, runner.cache.host.bytes_used) == (0, 0)
    assert generate(runner, A)[0] == 0


def test_a_restore_the_pool_has_no_room_for_leaves_the_tier_and_the_pool_as_they_were(transformer):
    runner = new_runner(transformer, host_blocks=32)
    prefill_and_free(runner, A)
    held = runner.allocate_slot()
    runner.prefill(held, B)  # holds 8 blocks: all of A's are in the tier, and no block is free
    slot = runner.allocate_slot()
    with pytest.raises(KVCacheFull):
        runner.reuse_prefix(slot, A)
    runner.free_slot(slot)
    runner.free_slot(held)
    assert runner.cache.pool.num_used == 0
    assert generate(runner, A)[0] == A_REUSED


def test_forgetting_the_prefixes_empties_the_tier(transformer):
    runner = new_runner(transformer, host_blocks=32)
    prefill_and_free(runner, A)
    prefill_and_free(runner, B)
    runner.cache.forget_prefixes()  # the weights changed: no stored KV is valid
    assert runner.cache.host.bytes_used == 0
    assert generate(runner, A)[0] == 0


def test_a_host_tier_larger_than_the_free_host_memory_is_refused_before_the_load():
    with pytest.raises(MemoryError, match="host_cache_mb"):
        check_host_cache("model", LoadOptions(host_cache_mb=2**40))  # an exbibyte: no host has it
