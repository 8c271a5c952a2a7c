"""The paged decode-attention kernel: on the real stories260K model (grouped-query attention) a batch of rows of
different lengths, blocks out of order, decodes to the logits the gather-and-SDPA path gives, step after step; on
float32, float16 and bfloat16 pools it stores each row's rotated key and its value where the row's new position lies,
as torch would, and attends as float32 attention over the stored values does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.execution.runner import ModelRunner
from inference.engine.kernels import matmul as matmul_kernel
from inference.engine.kernels.paged_attention import KERNEL, decode_attention
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.model.rope import rotate_half
from tests.engine.kernel_marks import needs_paged_kernel
from tests.greedy import greedy

pytestmark = needs_paged_kernel

PROMPT = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]  # BOS "Once upon a time ..."


@pytest.fixture(scope="module")
def transformer(stories_hf_dir):
    checkpoint = read_hf_dir(stories_hf_dir)
    return build_model(checkpoint.config, checkpoint.tensors, context_window=256)


def decode_logits(transformer, *, kernel: bool) -> list[torch.Tensor]:
    """Logits of eight batched decode steps of four rows (3, 13, 29 and 40 tokens held), freed and re-allocated so
    that no row's blocks are consecutive."""
    runner = ModelRunner(transformer, max_concurrent=6, context_window=256)
    assert runner.cache.paged_decode  # the kernel is built and serves CPU decode steps
    runner.cache.paged_decode = kernel
    spacer = runner.allocate_slot()
    slots = []
    for length in (3, 13, 29, 40):
        slots.append(runner.allocate_slot())
        runner.prefill(slots[-1], (PROMPT * 4)[:length])
        runner.prefill(spacer, PROMPT)  # interleaves the rows' blocks with another slot's
    order = [slots[2], slots[0], slots[3], slots[1]]
    tokens, steps = [11, 12, 13, 14], []
    for _ in range(8):
        logits = runner.decode(order, tokens)
        steps.append(logits)
        tokens = logits.argmax(-1).tolist()
    return steps


def test_decode_through_the_kernel_equals_the_gather_path(transformer):
    assert KERNEL is not None
    through_kernel = decode_logits(transformer, kernel=True)
    gathered = decode_logits(transformer, kernel=False)
    for step, (ours, reference) in enumerate(zip(through_kernel, gathered, strict=True)):
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4, msg=f"step {step}")


# dims: 64 and 40 (32 lanes at a time, then 8), 8 (stories260K's heads), 12 (not a multiple of 8: the portable path
# even where AVX2 runs); a block of 12 positions ends in a piece of 4 in the middle of a row.
@pytest.mark.parametrize(("dim", "block_size"), [(64, 16), (40, 16), (8, 16), (12, 16), (64, 12), (8, 12)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_kernel_rotates_stores_and_attends_over_16_and_32_bit_pools_as_torch_does(dtype, dim, block_size):
    gen = torch.Generator().manual_seed(0)
    kv_heads, group, pool_blocks = 2, 3, 20
    heads = kv_heads * group
    keys = torch.randn(kv_heads, pool_blocks, block_size, dim, generator=gen).to(dtype)
    values = torch.randn(kv_heads, pool_blocks, block_size, dim, generator=gen).to(dtype)
    table = torch.tensor([[7, 2, 19], [4, 11, 0], [5, 9, 13]])  # [B, nb]: each row's blocks, in position order
    lengths = torch.tensor([3 * block_size, 1, block_size + 5])  # a full table, one position, part of the second
    qkv = torch.randn(3, heads + 2 * kv_heads, dim, generator=gen)
    angles = torch.randn(3, dim // 2, generator=gen)  # each row's own rotation
    cos, sin = torch.cat((angles, angles), -1).cos(), angles.sin()
    sin_signed = torch.cat((-sin, sin), -1)
    new = lengths - 1  # each row's new position: its last
    block = table[torch.arange(3), new // block_size]
    write_rows = torch.stack([(h * pool_blocks + block) * block_size + new % block_size for h in range(kv_heads)], 1)
    expected_keys, expected_values = keys.clone(), values.clone()
    rotated = rotate_half(qkv[:, : heads + kv_heads], cos[:, None], sin_signed[:, None])
    for row in range(3):
        for h in range(kv_heads):
            at = divmod(int(write_rows[row, h]), block_size)
            expected_keys.view(-1, block_size, dim)[at] = rotated[row, heads + h].to(dtype)
            expected_values.view(-1, block_size, dim)[at] = qkv[row, heads + kv_heads + h].to(dtype)

    out = decode_attention(qkv, cos, sin_signed, keys, values, write_rows.reshape(-1), table, lengths)

    assert torch.equal(values, expected_values)  # stored as torch converts, bit for bit
    # rotated keys: float32 sums in another order round differently in the last bit (then in the 16-bit last bit)
    ulp = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(keys.float(), expected_keys.float(), atol=4 * ulp, rtol=ulp)
    for row in range(3):
        held = table[row].tolist()
        k = keys[:, held].reshape(kv_heads, -1, dim)[:, : lengths[row]].float()  # [Hkv, L, hd]
        v = values[:, held].reshape(kv_heads, -1, dim)[:, : lengths[row]].float()
        q = rotated[row, :heads].view(kv_heads, group, dim)
        expected = F.scaled_dot_product_attention(q, k, v)  # [Hkv, G, hd]
        torch.testing.assert_close(out[row].view(kv_heads, group, dim), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_kv_cache_decodes_the_same_greedy_text_with_logits_close_to_float32(transformer, kv_dtype):
    wide = ModelRunner(transformer, max_concurrent=1, context_window=256)
    narrow = ModelRunner(transformer, max_concurrent=1, context_window=256, kv_dtype=kv_dtype)
    assert narrow.cache.keys[0].dtype == kv_dtype and narrow.cache.paged_decode
    # 40 greedy tokens; the logits compared are the prefill's (26 tokens: it reads its own first block back) and
    # the first decode step's
    wide_run, narrow_run = greedy(wide, PROMPT * 2, 40), greedy(narrow, PROMPT * 2, 40)
    assert narrow_run.tokens == wide_run.tokens
    pairs = [(narrow_run.prompt_logits, wide_run.prompt_logits), (narrow_run.steps[0], wide_run.steps[0])]
    for ours, reference in pairs:  # measured: <= 0.7% (bfloat16)
        assert (ours - reference).abs().max() < 0.01 * reference.abs().max()


def test_any_number_of_threads_decodes_the_same_logits(transformer):
    """The kernel shares its (row, kv head) pairs out on the matmul kernel's elastic pool (_pool_run.h): each pair is
    computed by one thread, so the logits are the same bit for bit on one thread or three."""
    before = matmul_kernel.KERNEL.threads()
    try:
        matmul_kernel.set_threads(1)
        alone = decode_logits(transformer, kernel=True)
        matmul_kernel.set_threads(3)
        shared = decode_logits(transformer, kernel=True)
    finally:
        matmul_kernel.set_threads(before)
    for step, (one, three) in enumerate(zip(alone, shared, strict=True)):
        assert torch.equal(one, three), f"step {step}"
