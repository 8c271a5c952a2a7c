"""The flex attention backend (model/flex_attention.py) against the gather one on the same weights, float32 on the CPU:
the same logits (within 1e-5 of the largest) and the same greedy tokens for decode batches of rows of different lengths,
a prompt prefilled in chunks, prompts that start from cached blocks, a session's turns, truncation, export and restore,
and steps that mix prefill chunks with decode rows; and a block mask that visits every block a query may see, and only
its rows' blocks. stories260K has 8 heads over 4 KV heads; the random qwen3 adds q/k/v bias and q/k norms."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.model.flex_attention import Q_BLOCK, step_block_mask
from inference.engine.model.transformer import Transformer
from tests.engine.test_weights_storage import tiny_qwen3

WINDOW = 96
PROMPT = [1] + [(37 * i + 11) % 290 + 5 for i in range(39)]  # 40 tokens, in both models' vocabularies


@pytest.fixture(scope="module", params=["stories260K", "qwen3"])
def model(request, stories_hf_dir) -> Transformer:
    if request.param == "qwen3":
        config, tensors = tiny_qwen3()
        return build_model(config, tensors, context_window=WINDOW)
    checkpoint = read_hf_dir(stories_hf_dir)
    return build_model(checkpoint.config, checkpoint.tensors, context_window=WINDOW)


def runner(model: Transformer, attention: str) -> ModelRunner:
    return ModelRunner(model, max_concurrent=4, context_window=WINDOW, cache_tokens=64, attention=attention)


def same_on_both(model: Transformer, scenario: Callable[[ModelRunner], list[torch.Tensor]]) -> list[torch.Tensor]:
    """Runs `scenario` on a gather runner and on a flex runner of `model`: every logits tensor it returns the same
    within 1e-5 of its largest logit (float32's rounding alone moves stories260K's logits by 1.6e-5 of ~20 when the
    gather path prefills a prompt in other chunks: docs/attention.md), with the same greedy token; the gather
    runner's logits."""
    gather, flex = scenario(runner(model, "gather")), scenario(runner(model, "flex"))
    assert len(gather) == len(flex)
    for expected, actual in zip(gather, flex, strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-5 * expected.abs().max().item(), rtol=0)
        assert torch.equal(actual.argmax(-1), expected.argmax(-1))
    return gather


def decode_greedy(run: ModelRunner, slots: list[int], logits: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """`steps` greedy decode steps of `slots` from their last logits [B, V]; each step's logits."""
    out = []
    for _ in range(steps):
        logits = run.decode(slots, logits.argmax(-1).tolist())
        out.append(logits)
    return out


def test_decode_batches_of_rows_of_different_lengths(model):
    def scenario(run: ModelRunner) -> list[torch.Tensor]:
        slots = [run.allocate_slot() for _ in range(3)]
        firsts = torch.stack([run.prefill(s, PROMPT[:n]) for s, n in zip(slots, (3, 17, 33), strict=True)])
        steps = decode_greedy(run, slots, firsts, 20)  # rows cross block ends at different steps
        return [firsts, *steps, *decode_greedy(run, slots[1:], steps[-1][1:], 4)]

    same_on_both(model, scenario)


def test_a_prompt_prefilled_in_chunks(model):
    def scenario(run: ModelRunner) -> list[torch.Tensor]:
        slot, logits, start = run.allocate_slot(), [], 0
        for size in (7, 16, 17):  # chunks that start and end mid-block
            logits.append(run.prefill(slot, PROMPT[start : start + size], all_logits=True))
            start += size
        return [*logits, *decode_greedy(run, [slot], logits[-1][-1:], 8)]

    chunked = same_on_both(model, scenario)
    whole = runner(model, "flex")
    at_once = whole.prefill(whole.allocate_slot(), PROMPT, all_logits=True)
    torch.testing.assert_close(at_once, torch.cat(chunked[:3]), atol=1e-5 * at_once.abs().max().item(), rtol=0)


def test_prompts_that_start_from_cached_blocks(model):
    def scenario(run: ModelRunner) -> list[torch.Tensor]:
        first = run.allocate_slot()
        logits = [run.prefill(first, PROMPT)]
        run.free_slot(first)  # its full blocks stay cached
        second = run.allocate_slot()
        prompt = [*PROMPT[:19], 7, 8, 9]  # a full block and 3 positions of the next (full, cached) one in common
        assert run.reuse_prefix(second, prompt) == 19  # the next block's 3 positions copied
        logits.append(run.prefill(second, prompt[19:]))
        return logits + decode_greedy(run, [second], logits[-1][None], 10)

    same_on_both(model, scenario)


def test_a_sessions_turns_truncation_export_and_restore(model):
    def scenario(run: ModelRunner) -> list[torch.Tensor]:
        slot = run.allocate_slot()
        logits = [run.prefill(slot, PROMPT[:12])]
        logits += decode_greedy(run, [slot], logits[-1][None], 6)
        logits.append(run.prefill(slot, PROMPT[12:30]))  # the next turn continues the kept slot
        run.truncate(slot, 21)  # mid-block: an edit of the conversation
        logits.append(run.prefill(slot, [5, 6, 7]))
        keys, values = run.cache.read(slot)
        restored = runner(run.model, run.attention)  # another worker's pool
        moved = restored.allocate_slot()
        restored.cache.write(moved, run.cache.token_ids(slot), keys, values)
        logits.append(restored.prefill(moved, [8, 9]))
        return logits + decode_greedy(restored, [moved], logits[-1][None], 6)

    same_on_both(model, scenario)


def test_steps_that_mix_prefill_chunks_and_decode_rows(model):
    def scenario(run: ModelRunner) -> list[torch.Tensor]:
        decoding = [run.allocate_slot() for _ in range(2)]
        firsts = torch.stack([run.prefill(s, PROMPT[:n]) for s, n in zip(decoding, (5, 20), strict=True)])
        prompts = [run.allocate_slot() for _ in range(2)]
        logits, tokens = [firsts], firsts.argmax(-1).tolist()
        for start in (0, 9, 18):  # each step: a chunk of each prompt, a token of each decoding row
            chunks, decoded = run.step(
                [(prompts[0], PROMPT[start : start + 9]), (prompts[1], PROMPT[20 + start : 29 + start])],
                decoding,
                tokens,
                all_logits=frozenset({1}),
            )
            logits += [*chunks, decoded]
            tokens = decoded.argmax(-1).tolist()
        return logits

    same_on_both(model, scenario)


def test_the_block_mask_visits_every_block_a_query_sees_and_only_its_rows_blocks(model):
    run = runner(model, "flex")
    slots = [run.allocate_slot() for _ in range(4)]
    for slot, n in zip(slots, (3, 17, 33, 8), strict=True):
        run.prefill(slot, PROMPT[:n])
    views = [run.cache.view([slots[3]], 21), run.cache.view(slots[:3], 1)]  # a chunk, then three decode rows
    cache, blocks = run.cache, run.cache.zeroed_blocks
    block_mask = step_block_mask(cache, views, blocks)
    queries = block_mask.seq_lengths[0]
    allowed = create_mask(block_mask.mask_mod, 1, 1, queries, blocks * cache.block_size, device="cpu")[0, 0]
    seen = allowed.view(queries // Q_BLOCK, Q_BLOCK, blocks, cache.block_size).any(3).any(1)
    visited = torch.zeros_like(seen)  # the blocks each query block's kernel tile visits
    counts, indices = block_mask.kv_num_blocks[0, 0], block_mask.kv_indices[0, 0]
    for query_block, count in enumerate(counts.tolist()):
        visited[query_block, indices[query_block, :count]] = True
    rows = [cache.blocks(slots[3])] * 21 + [cache.blocks(slot) for slot in slots[:3]]  # each query's row's blocks
    held = torch.zeros_like(visited)
    for query, row_blocks in enumerate(rows):
        held[query // Q_BLOCK, row_blocks] = True
    assert torch.equal(visited, held)
    assert not (seen & ~visited).any()
    assert allowed.sum() == sum(p + 1 for p in range(8, 29)) + sum(n + 1 for n in (3, 17, 33))  # causal, own row
