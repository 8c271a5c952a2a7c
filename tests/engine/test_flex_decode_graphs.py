"""The flex decode graphs (execution/flex_decode.py) on the real stories260K GGUF: a runner whose attention is
"flex" compiles decode graphs whose rows read only their live blocks of the pool, and they decode what the eager
gather runner decodes, rows of different lengths and padding rows together, without ever recompiling as the rows
grow block after block.

Compiling costs seconds per bucket, so the flex runner is built once, with the two buckets the tests use."""

from __future__ import annotations

import pytest
import torch

from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.loading import load_model
from tests.greedy import greedy_batch

pytestmark = pytest.mark.usefixtures("one_thread")  # compiled steps run with the threads their graphs were made for

WINDOW = 256  # 16 blocks of 16 positions
# a batch of 3 runs in bucket 4 with one padding row; prompts of 18, 5 and 2 tokens start in different blocks
PROMPTS = [[1, *range(50, 220, 10)], [1, 403, 407, 261, 378], [1, 22]]
STEPS = 150  # every row grows by more than nine blocks


@pytest.fixture(scope="module")
def eager(stories_gguf_path) -> ModelRunner:
    return load_model(stories_gguf_path, max_concurrent=4, context_window=WINDOW).runner


@pytest.fixture(scope="module")
def flex(eager) -> ModelRunner:
    runner = ModelRunner(eager.model, max_concurrent=4, context_window=WINDOW, attention="flex")
    graphs = runner.compile_decode(threads=1, buckets=[1, 4])
    assert (graphs.mode, graphs.buckets, graphs.fallback_reason) == ("compiled", [1, 4], None), graphs.fallback_reason
    return runner


def assert_same_decode(flex: ModelRunner, eager: ModelRunner, prompts: list[list[int]], steps: int = STEPS) -> None:
    """The same greedy tokens, from logits that differ only by rounding, and every step on the graphs: a recompilation
    (a shape that followed a row's length) would have been refused and sent the runner back to eager for good."""
    flex_ids, flex_logits = greedy_batch(flex, prompts, steps)
    eager_ids, eager_logits = greedy_batch(eager, prompts, steps)
    assert flex_ids == eager_ids
    # Rounding only: the compiled graph fuses the step's ops and sums in another order, about 1e-6 of the largest
    # logit over these steps; a row reading a wrong block or missing one is off by whole units.
    assert (flex_logits - eager_logits).abs().max() <= 1e-5 * eager_logits.abs().max()
    assert (flex.graphs.mode, flex.graphs.fallback_reason) == ("compiled", None), flex.graphs.fallback_reason


def test_rows_of_different_lengths_and_a_padding_row_decode_what_the_eager_runner_does(flex, eager):
    assert_same_decode(flex, eager, PROMPTS)


def test_a_lone_row_grows_across_the_window_without_a_recompilation(flex, eager):
    assert_same_decode(flex, eager, PROMPTS[2:], steps=WINDOW - len(PROMPTS[2]) - 1)  # to the window's last block


def test_views_made_without_the_paged_kernel_give_the_same_tables(flex, eager):
    """On CUDA (or a 16-bit pool) a decode view carries gather rows, or a lone row's consecutive blocks, instead of
    the paged kernel's table: the graph's tables are derived from those as well."""
    flex.cache.paged_decode = False
    try:
        assert_same_decode(flex, eager, PROMPTS, steps=40)
        assert_same_decode(flex, eager, PROMPTS[:1], steps=40)
    finally:
        flex.cache.paged_decode = True


def test_a_padding_row_leaves_every_other_block_of_the_pool_untouched(flex):
    """Three rows run in bucket 4: the padding row writes and reads the scratch block only, so every block but the
    rows' own (and scratch) holds the same bits after the steps, whatever earlier tests left in it."""
    cache = flex.cache
    kept = flex.allocate_slot()  # a sequence outside the batch, of seven blocks
    flex.prefill(kept, [1, *range(300, 400)])
    slots = [flex.allocate_slot() for _ in PROMPTS]
    tokens = flex.prefill_batch(slots, PROMPTS).argmax(-1).tolist()
    before = [layer.clone() for layer in cache.keys + cache.values]
    for _ in range(20):
        tokens = flex.decode(slots, tokens).argmax(-1).tolist()
    written = {block for slot in slots for block in cache.blocks(slot)}
    others = [block for block in range(cache.scratch) if block not in written]
    for old, new in zip(before, cache.keys + cache.values, strict=True):
        assert torch.equal(old[:, others].view(torch.uint8), new[:, others].view(torch.uint8))  # bits: NaN too
    scratch = [layer[:, cache.scratch] for layer in cache.keys + cache.values]
    assert all(block.isfinite().all() for block in scratch)  # gather steps read it, masked: 0 times NaN is NaN
    for slot in [kept, *slots]:
        flex.free_slot(slot)
    assert flex.graphs.mode == "compiled"
