"""The step-level API on the real stories260K model: slots, chunked prefill, batched decode, limits."""

from __future__ import annotations

import pytest
import torch

from inference.engine.errors import ContextOverflow, KVCacheFull
from inference.engine.execution.runner import ModelRunner, attention_backends
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir

PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]  # BOS "Once upon a time ..."


@pytest.fixture(scope="module")
def checkpoint(stories_hf_dir):
    return read_hf_dir(stories_hf_dir)


@pytest.fixture
def runner(checkpoint) -> ModelRunner:
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64)
    return ModelRunner(model, max_concurrent=3, context_window=64)


def test_chunked_prefill_gives_the_same_logits_as_one_prefill(runner):
    whole = runner.prefill(runner.allocate_slot(), PROMPT, all_logits=True)
    slot = runner.allocate_slot()
    chunks = [runner.prefill(slot, PROMPT[a:b], all_logits=True) for a, b in ((0, 4), (4, 5), (5, 13))]
    assert runner.slot_length(slot) == len(PROMPT)
    assert torch.allclose(torch.cat(chunks), whole, atol=1e-4, rtol=0)
    assert whole.shape == (len(PROMPT), runner.vocab_size)
    last = runner.prefill(runner.allocate_slot(), PROMPT)
    assert last.shape == (runner.vocab_size,)
    assert torch.allclose(last, whole[-1], atol=1e-4, rtol=0)


def test_decode_equals_prefill_of_the_same_token(runner):
    a, b = runner.allocate_slot(), runner.allocate_slot()
    runner.prefill(a, PROMPT[:-1])
    decoded = runner.decode([a], [PROMPT[-1]])[0]
    prefilled = runner.prefill(b, PROMPT)
    assert torch.allclose(decoded, prefilled, atol=1e-4, rtol=0)


def test_batched_decode_of_different_lengths_in_any_slot_order_equals_decoding_alone(runner):
    lengths = {0: 3, 1: 13, 2: 8}
    slots = [runner.allocate_slot() for _ in lengths]
    for slot in slots:
        runner.prefill(slot, PROMPT[: lengths[slot]])
    order = [2, 0, 1]  # not consecutive: the cache is read through an index, not a view
    batched = runner.decode(order, [11, 12, 13])
    assert batched.shape == (3, runner.vocab_size)
    for row, (slot, token) in enumerate(zip(order, [11, 12, 13], strict=True)):
        runner.truncate(slot, lengths[slot])
        alone = runner.decode([slot], [token])[0]
        assert torch.allclose(batched[row], alone, atol=1e-4, rtol=0)
        assert runner.slot_length(slot) == lengths[slot] + 1


def test_a_prompt_chunk_and_decode_rows_share_one_forward_pass_with_the_same_logits_as_apart(runner):
    passes = []
    runner.model.register_forward_hook(lambda *_: passes.append(1))
    decoders = [runner.allocate_slot(), runner.allocate_slot()]
    for slot, length in zip(decoders, (5, 11), strict=True):
        runner.prefill(slot, PROMPT[:length])
    newcomer = runner.allocate_slot()
    passes.clear()
    chunks, decoded = runner.step([(newcomer, PROMPT[:9])], decoders, [PROMPT[5], PROMPT[11]])
    assert len(passes) == 1  # the chunk and the decode rows read the weights once between them
    assert [runner.slot_length(s) for s in (*decoders, newcomer)] == [6, 12, 9]
    for slot, length in zip((*decoders, newcomer), (5, 11, 0), strict=True):
        runner.truncate(slot, length)
    prefilled = runner.prefill(newcomer, PROMPT[:9])
    torch.testing.assert_close(chunks[0], prefilled, atol=1e-4, rtol=0)
    torch.testing.assert_close(decoded, runner.decode(decoders, [PROMPT[5], PROMPT[11]]), atol=1e-4, rtol=0)


def test_a_step_that_would_overflow_a_slot_writes_nothing(runner):
    full, other = runner.allocate_slot(), runner.allocate_slot()
    runner.prefill(full, PROMPT * 4 + PROMPT[:12])  # 64: the whole window
    with pytest.raises(ContextOverflow):
        runner.step([(other, PROMPT)], [full], [5])
    assert (runner.slot_length(other), runner.slot_length(full), runner.cache.blocks(other)) == (0, 64, [])


def test_truncate_then_continue_equals_a_fresh_sequence(runner):
    slot = runner.allocate_slot()
    runner.prefill(slot, PROMPT)
    runner.truncate(slot, 5)
    assert runner.slot_length(slot) == 5
    continued = runner.prefill(slot, [300, 301, 302], all_logits=True)
    fresh = runner.prefill(runner.allocate_slot(), PROMPT[:5] + [300, 301, 302], all_logits=True)
    assert torch.allclose(continued, fresh[5:], atol=1e-4, rtol=0)
    with pytest.raises(ValueError):
        runner.truncate(slot, 9)


def test_the_pool_runs_out_of_blocks_and_freed_ones_come_back_empty(runner):
    blocks = runner.cache.pool.num_blocks  # 3 sequences of 64 positions, in blocks of 16
    assert blocks == 3 * 64 // 16
    slots = [runner.allocate_slot() for _ in range(3)]
    for slot in slots:
        runner.prefill(slot, [5 + slot] * 64)
    assert runner.cache.pool.num_free == 0
    with pytest.raises(KVCacheFull):
        runner.prefill(runner.allocate_slot(), PROMPT)
    runner.free_slot(slots[1])
    runner.free_slot(slots[1])  # idempotent
    assert runner.cache.pool.num_free == 64 // 16
    reused = runner.allocate_slot()
    assert runner.slot_length(reused) == 0
    # the new slot starts empty: its logits are those of a fresh sequence, not a continuation of the freed one
    first = runner.prefill(reused, PROMPT[:1])
    runner.free_slot(slots[0])
    assert torch.allclose(first, runner.prefill(runner.allocate_slot(), PROMPT[:1]), atol=1e-4, rtol=0)


def test_context_overflow_and_misuse_are_refused(runner):
    slot = runner.allocate_slot()
    with pytest.raises(ContextOverflow):
        runner.prefill(slot, [5] * 65)
    runner.prefill(slot, [5] * 64)
    with pytest.raises(ContextOverflow):
        runner.decode([slot], [5])
    assert runner.slot_length(slot) == 64
    other = runner.allocate_slot()
    with pytest.raises(ValueError):
        runner.decode([other, other], [5, 6])
    with pytest.raises(ValueError):
        runner.prefill(other, [])
    runner.free_slot(other)
    with pytest.raises(ValueError):
        runner.decode([other], [5])


def test_cuda_forward_passes_attend_without_cudnn_and_leave_the_settings_as_they_were():
    """cuDNN's attention builds a plan for each new shape and a decode step's attended length is new every step:
    on an H200 that made an eager step 75 ms instead of ~10 (docs/performance.md, "GPU check"). CI has no GPU, so
    this holds the switch the runner's CUDA passes run under; the GPU check measures what it buys."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_backends(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with attention_backends(torch.device("cpu")):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
