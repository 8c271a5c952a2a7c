"""A model split across two CPU ranks (gloo, a follower process beside this one) computes what one rank computes:
the same greedy ids, through prefills, batched steps and prefix-cache hits; and a split that cannot be made, or a use
of the weights a split model cannot serve, is refused with a reason."""

import pytest
import torch

from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.engine.errors import LoadError
from inference.engine.kv.sessions import SessionTable
from inference.engine.loaders.loading import load_model
from inference.engine.parallel.split_load import load_split_model
from inference.engine.session_calls import answer
from inference.engine.weights.served_weights import attach_refusal

PROMPTS = ["Once upon a time", "The little dog ran to the park and", "Lily had a red ball. She"]
WINDOW = 256
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside with her mom and dad."


@pytest.fixture(scope="module")
def one_rank(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=4, context_window=WINDOW, cache_tokens=256)


@pytest.fixture(scope="module")
def two_ranks(stories_hf_dir):
    model = load_split_model(stories_hf_dir, 2, device="cpu", max_concurrent=4, context_window=WINDOW,
                             cache_tokens=256)  # fmt: skip
    yield model
    model.split.close()


def greedy(model, prompt_ids: list[int], tokens: int = 24) -> list[int]:
    runner = model.runner
    slot = runner.allocate_slot()
    logits = runner.prefill(slot, prompt_ids)
    out = []
    for _ in range(tokens):
        out.append(int(logits.argmax()))
        logits = runner.decode([slot], [out[-1]])[0]
    runner.free_slot(slot)
    return out


def batched(model, first: list[int], second: list[int], tokens: int = 16) -> tuple[list[list[int]], int]:
    """`first` prefilled alone, then `second` (which begins with `first`'s text: a prefix-cache hit) prefilled in
    the same step as `first`'s decode rows, then both decoded together; each one's greedy ids and the tokens the
    second reused."""
    runner = model.runner
    a = runner.allocate_slot()
    a_ids = [int(runner.prefill(a, first).argmax())]
    runner.decode([a], [a_ids[-1]])  # a's blocks fill and are named; its next token is decoded in the batch below
    b = runner.allocate_slot()
    reused = runner.reuse_prefix(b, second)
    chunks, decoded = runner.step([(b, second[reused:])], [a], [a_ids[-1]])
    a_ids.append(int(decoded[0].argmax()))
    b_ids = [int(chunks[0].argmax())]
    for _ in range(tokens):
        logits = runner.decode([a, b], [a_ids[-1], b_ids[-1]])
        a_ids.append(int(logits[0].argmax()))
        b_ids.append(int(logits[1].argmax()))
    runner.free_slot(a)
    runner.free_slot(b)
    return [a_ids, b_ids], reused


@pytest.mark.parametrize("prompt", PROMPTS)
def test_two_ranks_decode_the_greedy_ids_of_one(one_rank, two_ranks, prompt):
    ids = one_rank.tokenizer.encode(prompt)
    assert greedy(two_ranks, ids) == greedy(one_rank, ids)


def test_a_batched_step_with_a_prefix_cache_hit_matches_one_rank(one_rank, two_ranks):
    tok = one_rank.tokenizer
    first = tok.encode(STORY)
    assert len(first) >= 32  # two full blocks, both named once prefilled
    second = first[:20] + tok.encode(" and a big dog", add_special_tokens=False)
    expected, reused_one = batched(one_rank, first, second)
    got, reused_two = batched(two_ranks, first, second)
    # one whole block, then 4 positions of the next copied into a block of its own (a pool change the ranks share)
    assert reused_two == reused_one == 20
    assert got == expected


def test_a_gguf_file_expanded_to_float32_splits_too(stories_gguf_path):
    one = load_model(stories_gguf_path, dtype="float32", max_concurrent=1, context_window=WINDOW)
    two = load_split_model(stories_gguf_path, 2, device="cpu", dtype="float32", max_concurrent=1,
                           context_window=WINDOW)  # fmt: skip
    ids = one.tokenizer.encode(PROMPTS[1])
    try:
        assert greedy(two, ids) == greedy(one, ids)
    finally:
        two.split.close()


def test_each_rank_holds_its_own_heads(one_rank, two_ranks):
    model, whole = two_ranks.runner.model, one_rank.runner.model
    assert model.config.num_heads * 2 == whole.config.num_heads
    assert two_ranks.runner.cache.keys[0].shape[0] * 2 == one_rank.runner.cache.keys[0].shape[0]
    assert two_ranks.runner.plan is None and two_ranks.split.report().backend == "gloo"


def test_a_split_that_does_not_divide_is_refused_before_any_rank_starts(stories_hf_dir):
    with pytest.raises(LoadError, match="8 attention heads and 4 KV heads .* do not divide by tensor_parallel 3"):
        load_split_model(stories_hf_dir, 3, device="cpu", max_concurrent=1, context_window=WINDOW)


def test_a_quantized_split_is_refused_with_the_followers_ended(stories_hf_dir):
    with pytest.raises(LoadError, match="a tensor-parallel load takes float weights only") as refused:
        load_split_model(stories_hf_dir, 2, device="cpu", max_concurrent=1, context_window=WINDOW, quantize=True)
    assert refused.value.path == str(stories_hf_dir)


def test_a_split_model_refuses_a_trainer_and_session_export(two_ranks):
    assert attach_refusal(two_ranks, attachable_load=True) == "tensor_parallel"
    sessions = SessionTable(two_ranks.runner.cache, max_sessions=2, idle_ttl=60, watch_grace=60)
    refused = answer(two_ranks, sessions, p.SessionExport(request_id="r1", model="m", session_id="s"))
    assert refused.reason == Reason.BAD_REQUEST and "split across 2 ranks" in refused.message


def test_the_follower_ends_when_the_split_is_closed(stories_hf_dir):
    model = load_split_model(stories_hf_dir, 2, device="cpu", max_concurrent=1, context_window=WINDOW)
    assert greedy(model, [1, 403], tokens=2)
    model.split.close()
    assert [proc.returncode for proc in model.split.followers] == [0]


def test_shard_logits_match_closely(one_rank, two_ranks):
    """Not only the argmax: the split's logits are the whole model's up to the order of float sums."""
    ids = one_rank.tokenizer.encode(PROMPTS[0])
    logits = []
    for model in (one_rank, two_ranks):
        slot = model.runner.allocate_slot()
        logits.append(model.runner.prefill(slot, ids))
        model.runner.free_slot(slot)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)
