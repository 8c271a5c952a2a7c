"""The batched sampler: greedy, filters, penalties, bias, seeds and logprobs, row by row in one call.

Filtered distributions are checked against transformers' own logits warpers, and sampled frequencies
against those distributions with a chi-square test over a few thousand seeded draws.
"""

import math

import msgspec
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference.engine.contract.params import SamplingParams
from inference.engine.sampler import SequenceSampling, sample_batch
from inference.engine.token_draw import HEAD_LIMIT


def states_for(params: list[SamplingParams], vocab: int) -> list[SequenceSampling]:
    return [SequenceSampling(p, vocab) for p in params]


def random_logits(batch: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def reference_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits: [V] -> the distribution transformers' warpers sample from for these parameters."""
    scores = logits[None].clone()
    warpers = [TemperatureLogitsWarper(p.temperature)]
    if p.top_k:
        warpers.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1:
        warpers.append(TopPLogitsWarper(p.top_p))
    if p.min_p > 0:
        warpers.append(MinPLogitsWarper(p.min_p))
    for warper in warpers:
        scores = warper(None, scores)
    return scores.softmax(dim=-1)[0]


def draw_many(logits: torch.Tensor, params: SamplingParams, draws: int) -> torch.Tensor:
    """Sample `draws` rows of the same logits [V], each with its own seed -> token ids [draws]."""
    rows = [SamplingParams(**{**_fields(params), "seed": seed}) for seed in range(draws)]
    result = sample_batch(logits[None].expand(draws, -1), states_for(rows, logits.shape[0]))
    return torch.tensor(result.token_ids)


def _fields(params: SamplingParams) -> dict:
    return msgspec.structs.asdict(params)


def assert_follows(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Sampled tokens never leave the support and their counts pass a chi-square test (p = 1e-4)."""
    counts = torch.bincount(tokens, minlength=probs.shape[0]).double()
    outside = (counts > 0) & (probs == 0)
    assert not outside.any(), f"sampled tokens with zero probability: {outside.nonzero().flatten().tolist()}"
    expected = probs.double() * tokens.shape[0]
    small = (expected < 5) & (probs > 0)
    observed = torch.cat([counts[expected >= 5], counts[small].sum()[None]])
    wanted = torch.cat([expected[expected >= 5], expected[small].sum()[None]])
    if wanted[-1] == 0:
        observed, wanted = observed[:-1], wanted[:-1]
    chi2 = float(((observed - wanted) ** 2 / wanted).sum())
    df = max(len(wanted) - 1, 1)
    # Wilson-Hilferty approximation of the chi-square quantile at p = 1e-4 (z = 3.72)
    critical = df * (1 - 2 / (9 * df) + 3.72 * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < critical, f"chi2 {chi2:.1f} over {critical:.1f} with {df} degrees of freedom"


FILTER_CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6),
    SamplingParams(temperature=1.5, top_k=5),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.8, min_p=0.15),
    SamplingParams(temperature=1.3, top_k=10, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=12, top_p=0.5),
]


@pytest.mark.parametrize("params", FILTER_CASES, ids=repr)
def test_sampled_frequencies_follow_transformers_warpers(params):
    logits = random_logits(1, 16, seed=7, scale=1.5)[0]
    tokens = draw_many(logits, params, draws=4000)
    assert_follows(tokens, reference_probs(logits, params))


def test_draws_across_steps_of_one_sequence_follow_the_distribution():
    logits = random_logits(1, 8, seed=3, scale=1.0)
    state = SequenceSampling(SamplingParams(seed=1234), 8)
    tokens = torch.tensor([sample_batch(logits, [state]).token_ids[0] for _ in range(2000)])
    assert_follows(tokens, logits[0].softmax(dim=-1))


def test_large_top_k_and_top_p_over_the_whole_vocabulary_keep_exactly_transformers_support():
    vocab = 2 * HEAD_LIMIT
    logits = random_logits(1, vocab, seed=11, scale=0.3)[0]
    for params in (SamplingParams(top_k=HEAD_LIMIT + 200), SamplingParams(top_k=HEAD_LIMIT + 200, top_p=0.5)):
        allowed = reference_probs(logits, params) > 0
        tokens = draw_many(logits, params, draws=1500)
        assert allowed[tokens].all()
        # the boundary matters: the flat distribution reaches deep into the kept set
        assert len(set(tokens.tolist())) > 0.5 * int(allowed.sum())


def test_top_p_and_min_p_exclude_tokens_below_their_cut():
    # probabilities by token id 0.15, 0.5, 0.05, 0.3 (ranked 1, 3, 0, 2)
    logits = torch.tensor([0.15, 0.5, 0.05, 0.3]).log()
    assert set(draw_many(logits, SamplingParams(top_p=0.75), 2000).tolist()) == {1, 3}
    assert set(draw_many(logits, SamplingParams(top_p=0.85), 2000).tolist()) == {0, 1, 3}
    assert set(draw_many(logits, SamplingParams(min_p=0.2), 2000).tolist()) == {0, 1, 3}
    # top_p 0.95 of the top 3 keeps all three; min_p 0.45 then drops 0.15 (< 0.45 * 0.5)
    assert set(draw_many(logits, SamplingParams(top_k=3, top_p=0.95, min_p=0.45), 2000).tolist()) == {1, 3}


def test_temperature_zero_or_below_is_argmax_even_next_to_sampling_rows():
    logits = random_logits(6, 32000, seed=1)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0, top_k=40, seed=1),
        SamplingParams(temperature=-1.0),
        SamplingParams(temperature=0.9, top_p=0.9, seed=2),
        SamplingParams(temperature=0.0, top_p=0.5, top_k=3),
        SamplingParams(temperature=0.0),
    ]
    tokens = sample_batch(logits, states_for(params, 32000)).token_ids
    argmax = logits.argmax(dim=-1).tolist()
    assert [tokens[i] for i in (0, 2, 4, 5)] == [argmax[i] for i in (0, 2, 4, 5)]
    assert sample_batch(logits, states_for([SamplingParams(temperature=0)] * 6, 32000)).token_ids == argmax


def test_top_k_one_equals_greedy():
    logits = random_logits(16, 32000, seed=2)
    params = [SamplingParams(temperature=1.5, top_k=1, seed=seed) for seed in range(16)]
    assert sample_batch(logits, states_for(params, 32000)).token_ids == logits.argmax(dim=-1).tolist()


def sequence(logits_per_step: list[torch.Tensor], row: int, states: list[SequenceSampling]) -> list[int]:
    return [sample_batch(step_logits, states).token_ids[row] for step_logits in logits_per_step]


def test_same_seed_same_tokens_different_seed_different_tokens():
    steps = [random_logits(1, 32000, seed=100 + i, scale=1.0) for i in range(8)]

    def run(seed: int) -> list[int]:
        return sequence(steps, 0, states_for([SamplingParams(temperature=1.0, top_p=0.95, seed=seed)], 32000))

    assert run(42) == run(42)
    assert run(42) != run(43)


BATCH_MATES = [
    SamplingParams(temperature=0.7, top_k=40, top_p=0.95, seed=5),
    SamplingParams(temperature=1.0, seed=6),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.2, top_p=0.9, min_p=0.02, seed=7, frequency_penalty=0.5),
    SamplingParams(temperature=0.9, top_k=7, seed=8, logit_bias={3: 5.0}, presence_penalty=1.0),
    SamplingParams(temperature=1.0, top_k=HEAD_LIMIT + 50, seed=9, logprobs=True, top_logprobs=3),
]


@pytest.mark.parametrize("position", [0, 3])
@pytest.mark.parametrize("params", BATCH_MATES, ids=repr)
def test_a_row_samples_the_same_alone_or_batched(params, position):
    vocab, steps = 2 * HEAD_LIMIT + 100, 4
    batch_logits = [random_logits(len(BATCH_MATES), vocab, seed=200 + i, scale=1.5) for i in range(steps)]
    mates = [p for p in BATCH_MATES if p is not params]
    batched = mates[:position] + [params] + mates[position:]
    row_logits = [step[position : position + 1] for step in batch_logits]
    alone = sequence(row_logits, 0, states_for([params], vocab))
    together = sequence(batch_logits, position, states_for(batched, vocab))
    assert alone == together


def test_logit_bias_minus_100_bans_and_plus_100_forces():
    vocab = 64
    logits = random_logits(1, vocab, seed=4, scale=1.0)
    favourite = int(logits.argmax())
    banned = SamplingParams(temperature=50.0, logit_bias={favourite: -100.0, 0: -100.0})
    tokens = draw_many(logits[0], banned, draws=5000)
    assert favourite not in tokens.tolist() and 0 not in tokens.tolist()
    assert len(set(tokens.tolist())) == vocab - 2  # everything else is still reachable
    greedy_banned = SamplingParams(temperature=0.0, logit_bias={favourite: -100.0})
    assert sample_batch(logits, states_for([greedy_banned], vocab)).token_ids[0] != favourite
    forced = draw_many(logits[0], SamplingParams(temperature=1.0, logit_bias={17: 100.0}), draws=2000)
    assert set(forced.tolist()) == {17}
    assert sample_batch(logits, states_for([SamplingParams(temperature=0, logit_bias={17: 100})], vocab)).token_ids == [
        17
    ]


def test_logit_bias_outside_the_vocabulary_is_ignored():
    logits = random_logits(1, 10, seed=5)
    params = SamplingParams(temperature=0.0, logit_bias={10: 100.0, -1: 100.0, 99999: -100.0})
    assert sample_batch(logits, states_for([params], 10)).token_ids == logits.argmax(dim=-1).tolist()


def test_logprobs_are_log_softmax_of_raw_logits_with_top_alternatives_in_order():
    logits = random_logits(3, 32000, seed=6)
    params = [
        SamplingParams(temperature=0.5, top_k=20, seed=1, logprobs=True, top_logprobs=5, logit_bias={7: 3.0}),
        SamplingParams(temperature=1.0, seed=2),
        SamplingParams(temperature=0.0, logprobs=True, top_logprobs=0),
    ]
    result = sample_batch(logits, states_for(params, 32000))
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert result.logprobs[1] is None
    for row in (0, 2):
        entry = result.logprobs[row]
        assert entry.logprob == pytest.approx(float(reference[row, result.token_ids[row]]), abs=1e-5)
        order = reference[row].argsort(descending=True)[: params[row].top_logprobs].tolist()
        assert [token for token, _ in entry.top] == order
        assert [lp for _, lp in entry.top] == pytest.approx(reference[row, order].tolist(), abs=1e-5)


def test_presence_and_frequency_penalties_follow_openai():
    # greedy: token 0 leads token 1 by 0.5, token 2 trails far behind
    logits = torch.tensor([[2.0, 1.5, -5.0]])
    presence = states_for([SamplingParams(temperature=0.0, presence_penalty=1.0)], 3)
    # presence is paid once per token however often it repeats: once both are used, 0 leads again for good
    assert [sample_batch(logits, presence).token_ids[0] for _ in range(4)] == [0, 1, 0, 0]
    # frequency: each repeat costs 0.3 more, so 0 leads until it has been used twice
    frequency = states_for([SamplingParams(temperature=0.0, frequency_penalty=0.3)], 3)
    assert [sample_batch(logits, frequency).token_ids[0] for _ in range(4)] == [0, 0, 1, 0]


def test_penalised_distribution_matches_the_openai_formula():
    vocab, draws = 12, 4000
    logits = random_logits(1, vocab, seed=9, scale=1.0)[0]
    history = [3, 3, 3, 5, 0, 5]
    presence, frequency = 0.7, 0.4
    states = states_for(
        [SamplingParams(seed=seed, presence_penalty=presence, frequency_penalty=frequency) for seed in range(draws)],
        vocab,
    )
    for state in states:
        for token in history:
            state.record(token)
    counts = torch.bincount(torch.tensor(history), minlength=vocab).float()
    expected = (logits - counts * frequency - (counts > 0).float() * presence).softmax(dim=-1)
    tokens = torch.tensor(sample_batch(logits[None].expand(draws, -1), states).token_ids)
    assert_follows(tokens, expected)


def test_a_request_without_seed_gets_its_own_random_seed_and_steps_advance():
    first, second = (SequenceSampling(SamplingParams(), 100) for _ in range(2))
    assert first.seed != second.seed
    logits = random_logits(2, 100, seed=8)
    sample_batch(logits, [first, second])
    sample_batch(logits, [first, second])
    assert first.step == 2 and sum(first.token_counts.values()) == 2


def test_refused_tokens_are_never_drawn_until_allowed_again_with_their_bias_and_penalties_back():
    state = SequenceSampling(SamplingParams(temperature=0, logit_bias={3: 5.0}, frequency_penalty=1.0), vocab_size=8)
    logits = torch.zeros(1, 8)
    logits[0, 2] = 3.0
    state.record(2)  # penalised once: 3.0 - 1.0 - 0 = 2.0, still below token 3's 5.0
    state.refuse([3])
    assert sample_batch(logits, [state]).token_ids == [2]
    state.allow([3])
    assert state.logit_adjustments == {3: 5.0, 2: -2.0}
    assert sample_batch(logits, [state]).token_ids == [3]
