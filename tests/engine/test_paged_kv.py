"""The paged KV cache on the real stories260K model: a prompt that starts with cached blocks reuses them and gets
the logits a full prefill gives, and so does one that leaves a cached block midway; shared blocks are held once; a
truncated shared block is copied before it is written; cached blocks are reclaimed least recently released first; KV
copied out and back in continues exactly; and memory in use follows the tokens held, not the windows."""

from __future__ import annotations

import pytest
import torch

from inference.engine.errors import KVCacheFull
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir

PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]  # BOS "Once upon a time ..."
LONG = (PROMPT * 4)[:45]  # two full blocks of 16 and 13 more positions


@pytest.fixture(scope="module")
def transformer(stories_hf_dir):
    checkpoint = read_hf_dir(stories_hf_dir)
    return build_model(checkpoint.config, checkpoint.tensors, context_window=4096)


@pytest.fixture
def runner(transformer) -> ModelRunner:
    return ModelRunner(transformer, max_concurrent=3, context_window=128)


def reference_logits(transformer, token_ids):
    """All logits of a prefill in a runner of its own (nothing cached)."""
    runner = ModelRunner(transformer, max_concurrent=1, context_window=128)
    return runner.prefill(runner.allocate_slot(), token_ids, all_logits=True)


def test_a_prompt_that_starts_with_cached_blocks_reuses_them_and_gets_the_same_logits(runner, transformer):
    first = runner.allocate_slot()
    runner.prefill(first, LONG)
    runner.free_slot(first)  # its two full blocks stay cached
    assert runner.cache.pool.num_cached == 2
    prompt = LONG[:40] + [300, 301, 302]
    slot = runner.allocate_slot()
    assert runner.reuse_prefix(slot, prompt) == 32
    assert runner.slot_length(slot) == 32
    logits = runner.prefill(slot, prompt[32:], all_logits=True)
    assert torch.allclose(logits, reference_logits(transformer, prompt)[32:], atol=1e-4, rtol=0)
    # a prompt that is only cached blocks still leaves its last token to compute (a step needs one)
    again = runner.allocate_slot()
    assert runner.reuse_prefix(again, LONG[:32]) == 31


def test_a_prompt_that_leaves_a_cached_block_midway_reuses_the_positions_it_shares(runner, transformer):
    first = runner.allocate_slot()
    runner.prefill(first, LONG)
    runner.free_slot(first)  # its two full blocks stay cached
    prompt = LONG[:26] + [300, 301, 302]  # the second block's first 10 positions, then its own
    slot = runner.allocate_slot()
    assert runner.reuse_prefix(slot, prompt) == 26
    logits = runner.prefill(slot, prompt[26:], all_logits=True)
    assert torch.allclose(logits, reference_logits(transformer, prompt)[26:], atol=1e-4, rtol=0)
    # the shared positions were copied into a block of the slot's own: the cached block still holds its prefix
    cached = runner.allocate_slot()
    assert runner.reuse_prefix(cached, LONG[:33]) == 32
    assert runner.cache.blocks(cached)[1] != runner.cache.blocks(slot)[1]
    continued = runner.prefill(cached, LONG[32:33])
    assert torch.allclose(continued, reference_logits(transformer, LONG[:33])[-1], atol=1e-4, rtol=0)
    # a first token that no cached block starts with reuses nothing
    assert runner.reuse_prefix(runner.allocate_slot(), [300] + LONG[1:20]) == 0


def test_two_sequences_sharing_a_prefix_hold_its_blocks_once(runner):
    owner = runner.allocate_slot()
    runner.prefill(owner, LONG[:32])
    pool = runner.cache.pool
    assert pool.num_used == 2
    a, b = runner.allocate_slot(), runner.allocate_slot()
    assert runner.reuse_prefix(a, LONG[:32] + [5, 6]) == 32
    assert runner.reuse_prefix(b, LONG[:32] + [7]) == 32
    runner.prefill(a, [5, 6])
    runner.prefill(b, [7])
    assert pool.num_used == 2 + 1 + 1  # the shared prefix once, one block each for the rest
    assert runner.cache.blocks(a)[:2] == runner.cache.blocks(b)[:2] == runner.cache.blocks(owner)


def test_truncating_into_a_shared_block_copies_it_before_writing(runner, transformer):
    owner = runner.allocate_slot()
    runner.prefill(owner, LONG[:32])
    other = runner.allocate_slot()
    runner.reuse_prefix(other, LONG[:32] + [9])
    runner.truncate(other, 20)  # into the owner's second block
    assert runner.cache.blocks(other)[0] == runner.cache.blocks(owner)[0]
    assert runner.cache.blocks(other)[1] != runner.cache.blocks(owner)[1]
    edited = runner.prefill(other, [300, 301], all_logits=True)
    assert torch.allclose(edited, reference_logits(transformer, LONG[:20] + [300, 301])[20:], atol=1e-4, rtol=0)
    # the owner's KV is untouched: its next token's logits are those of the unedited prompt
    continued = runner.prefill(owner, [302])
    assert torch.allclose(continued, reference_logits(transformer, LONG[:32] + [302])[-1], atol=1e-4, rtol=0)


def test_cached_blocks_are_reclaimed_least_recently_released_first(transformer):
    runner = ModelRunner(transformer, max_concurrent=1, context_window=64)  # 4 blocks
    older, newer = runner.allocate_slot(), runner.allocate_slot()
    runner.prefill(older, [5] * 16)
    runner.prefill(newer, [6] * 16)
    runner.free_slot(older)
    runner.free_slot(newer)
    assert runner.cache.pool.num_cached == 2
    big = runner.allocate_slot()
    runner.prefill(big, [7] * 40)  # three blocks: the two free ones and the older cached one
    probe = runner.allocate_slot()
    assert runner.reuse_prefix(probe, [6] * 16 + [1]) == 16  # the newer prefix survived
    runner.free_slot(probe)
    assert runner.reuse_prefix(runner.allocate_slot(), [5] * 16 + [1]) == 0  # the older one was taken
    with pytest.raises(KVCacheFull):
        runner.prefill(runner.allocate_slot(), [8] * 40)  # one block is free, the rest is held


def test_kv_copied_out_and_back_in_continues_exactly(runner, transformer):
    slot = runner.allocate_slot()
    runner.prefill(slot, LONG)
    keys, values = runner.cache.read(slot)
    assert keys[0].shape == (transformer.config.num_kv_heads, len(LONG), transformer.config.head_dim)
    restored = runner.allocate_slot()
    runner.cache.write(restored, LONG, keys, values)
    assert runner.cache.token_ids(restored) == LONG
    assert torch.equal(runner.decode([restored], [300])[0], runner.decode([slot], [300])[0])


def test_memory_in_use_follows_the_tokens_held_not_the_window(transformer):
    """32 short sequences on a 4096-token window: the slab layout reserved 32 x 4096 positions up front."""
    runner = ModelRunner(transformer, max_concurrent=32, context_window=4096)
    pool = runner.cache.pool
    assert pool.num_blocks * pool.block_size == 32 * 4096
    slots = [runner.allocate_slot() for _ in range(32)]
    lengths = [10 + 3 * i for i in range(32)]
    runner.prefill_batch(slots, [[400 + i] + [5] * (n - 1) for i, n in enumerate(lengths)])
    for _ in range(4):
        runner.decode(slots, [6] * 32)
    held = [n + 4 for n in lengths]
    assert pool.num_used == sum(-(-n // 16) for n in held)
    assert pool.num_used * pool.block_size < 2 * sum(held)  # at most one partial block per sequence
    for slot in slots:
        runner.free_slot(slot)
    assert pool.num_used == 0


def test_the_prefix_cache_is_whole_blocks_beyond_the_windows_and_keeps_what_they_would_evict(transformer):
    runner = ModelRunner(transformer, max_concurrent=1, context_window=64, cache_tokens=40)  # 4 blocks, 2 more
    assert (runner.cache_blocks, runner.cache.pool.num_blocks) == (2, 6)
    older = runner.allocate_slot()
    runner.prefill(older, [5] * 16 + [9])
    runner.free_slot(older)
    big = runner.allocate_slot()
    runner.prefill(big, [7] * 60)  # a full window: in a pool of the window alone, the older prefix would go
    runner.free_slot(big)
    assert runner.reuse_prefix(runner.allocate_slot(), [5] * 16 + [1]) == 16
    assert (runner.cache.lookup_tokens, runner.cache.hit_tokens) == (17, 16)


def test_a_pool_whose_memory_held_nans_computes_as_a_zeroed_one(transformer):
    """The pool is allocated empty and a block zeroed when first handed out: a decode batch whose shorter row reads
    positions past its length (masked) gets the logits it gets alone, not NaN, whatever the memory held before."""
    logits = []
    for garbage in (False, True):
        runner = ModelRunner(transformer, max_concurrent=2, context_window=64)
        if garbage:
            with torch.inference_mode():
                for layer in (*runner.cache.keys, *runner.cache.values):
                    layer[:, : runner.cache.scratch].fill_(float("nan"))
        runner.cache.paged_decode = False  # the gathered read other devices use: whole blocks, masked
        slots = [runner.allocate_slot(), runner.allocate_slot()]
        runner.prefill(slots[0], LONG)
        runner.prefill(slots[1], PROMPT[:5])
        logits.append(runner.decode(slots, [300, 300]))
    assert not logits[1].isnan().any()
    assert torch.equal(logits[0], logits[1])
