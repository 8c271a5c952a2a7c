"""The throughput paths: several prompts prefilled in one forward pass (runner and scheduler), and oneDNN-packed
linear layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, SamplingParams
from inference.engine.execution.runner import ModelRunner
from inference.engine.loaders.build import build_model
from inference.engine.loaders.hf import read_hf_dir
from inference.engine.loaders.loading import load_model
from inference.engine.model.transformer import PackedLinear
from inference.engine.sampler import SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence
from inference.engine.step_results import Streamed
from inference.engine.text.detokenizer import IncrementalDetokenizer

PROMPTS = [
    [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421],  # BOS "Once upon a time ..."
    [1, 403, 407],
    [1, 376, 298, 315, 421, 286, 261],
]


@pytest.fixture
def runner(stories_hf_dir) -> ModelRunner:
    checkpoint = read_hf_dir(stories_hf_dir)
    model = build_model(checkpoint.config, checkpoint.tensors, context_window=64)
    return ModelRunner(model, max_concurrent=6, context_window=64)


def greedy_continuation(runner: ModelRunner, slots: list[int], first: torch.Tensor, steps: int) -> list[list[int]]:
    tokens = first.argmax(-1).tolist()
    out = [[t] for t in tokens]
    for _ in range(steps):
        tokens = runner.decode(slots, tokens).argmax(-1).tolist()
        for row, token in zip(out, tokens, strict=True):
            row.append(token)
    return out


def test_batched_prefill_matches_one_prompt_at_a_time(runner):
    alone = [runner.allocate_slot() for _ in PROMPTS]
    alone_logits = torch.stack([runner.prefill(slot, ids) for slot, ids in zip(alone, PROMPTS, strict=True)])
    batched = [runner.allocate_slot() for _ in PROMPTS]
    batched_logits = runner.prefill_batch(batched, PROMPTS)  # ragged: padded to the longest
    assert batched_logits.shape == (len(PROMPTS), runner.vocab_size)
    torch.testing.assert_close(batched_logits, alone_logits, rtol=1e-4, atol=1e-4)
    assert [runner.slot_length(s) for s in batched] == [len(ids) for ids in PROMPTS]
    # the padding left nothing behind: both continue with the same greedy text
    assert greedy_continuation(runner, batched, batched_logits, 12) == greedy_continuation(
        runner, alone, alone_logits, 12
    )


def test_packed_linear_matches_linear_and_each_row_is_independent_of_its_batch():
    torch.manual_seed(0)
    linear = nn.Linear(768, 1024, bias=True).requires_grad_(False)
    packed = PackedLinear(linear)
    x = torch.randn(8, 1, 768)
    with torch.inference_mode():
        out = packed(x)
        torch.testing.assert_close(out, linear(x), rtol=1e-5, atol=1e-4)
        for row in range(8):  # bitwise: a sequence's logits never depend on who shares its batch
            assert torch.equal(packed(x[row : row + 1]), out[row : row + 1])
    assert packed.weight_nbytes == 768 * 1024 * 4


def test_a_burst_of_short_prompts_gets_its_first_tokens_in_one_step_and_the_same_text(stories_hf_dir):
    model = load_model(stories_hf_dir, max_concurrent=4)
    prompts = [model.tokenizer.encode(text) for text in ("Once upon a time", "The sun", "One day, a cat", "Lily")]

    def greedy(scheduler: Scheduler) -> tuple[list[list[int]], list[p.Message]]:
        for i, ids in enumerate(prompts):
            scheduler.add(
                Sequence(
                    f"r{i}",
                    ids,
                    sampling=SequenceSampling(SamplingParams(temperature=0.0), model.runner.vocab_size),
                    detokenizer=IncrementalDetokenizer(model.tokenizer),
                    options=GenerationOptions(max_tokens=16),
                    eos_token_ids=model.eos_token_ids,
                    context_window=model.runner.context_window,
                )
            )
        first_step = scheduler.step()
        messages = list(first_step)
        while scheduler.has_work:
            messages += scheduler.step()
        tokens = [[t for m in messages if isinstance(m, Streamed) and m.request_id == f"r{i}" for t in m.token_ids]
                  for i in range(len(prompts))]  # fmt: skip
        return tokens, first_step

    together, first_step = greedy(Scheduler(model.runner, model.tokenizer, max_concurrent=4, prefill_chunk=128))
    assert {m.request_id for m in first_step if isinstance(m, Streamed)} == {"r0", "r1", "r2", "r3"}
    # a budget of 4 tokens per step prefills them one after another: the same tokens, batch or not
    one_by_one, _ = greedy(Scheduler(model.runner, model.tokenizer, max_concurrent=4, prefill_chunk=4))
    assert together == one_by_one
