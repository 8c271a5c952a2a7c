"""Stopping a decode stuck in a loop: the detector on hand-made token lists, how a sequence ends by it, and the real
stories260K model driven into a loop by a logit bias, through the scheduler and through a load's ServingLimits."""

import random

import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, SamplingParams, ServingLimits
from inference.engine.hosted_model import HostedModel
from inference.engine.loaders.loading import load_model
from inference.engine.repetition import RepetitionDetector
from inference.engine.sampler import SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import LENGTH, REPETITION_LOOP, STOP, Sequence
from inference.engine.step_results import Ended, Streamed
from inference.engine.text.detokenizer import IncrementalDetokenizer
from inference.engine.text.tokenizer import Tokenizer
from tests.engine.test_sequence import feed

SPAN = 32


def first_loop(span, tokens):
    """The 1-based count of tokens after which the detector first fires, or None."""
    detector = RepetitionDetector(span)
    return next((n for n, token in enumerate(tokens, 1) if detector.push(token)), None)


def thue_morse(n):
    """The first n terms of the Thue-Morse sequence: no block of it ever appears three times in a row."""
    return [i.bit_count() % 2 for i in range(n)]


@pytest.mark.parametrize("period", [1, 2, 3, SPAN // 4])
def test_a_loop_fires_once_span_tokens_repeat_the_period(period):
    tokens = [100 + i % period for i in range(4 * SPAN)]
    assert first_loop(SPAN, tokens) == SPAN


def test_a_loop_after_free_text_fires_span_tokens_into_it():
    rng = random.Random(1)
    prefix = [rng.randrange(1000, 2000) for _ in range(100)]
    assert first_loop(SPAN, prefix + [5, 6, 7] * SPAN) == len(prefix) + SPAN


def test_a_period_longer_than_a_quarter_of_the_span_never_fires():
    period = SPAN // 4 + 1
    assert first_loop(SPAN, [i % period for i in range(10 * SPAN)]) is None


@pytest.mark.parametrize("span", [4, 8, SPAN, 256])
def test_no_false_positive_on_long_non_periodic_output(span):
    rng = random.Random(0)
    assert first_loop(span, [rng.randrange(512) for _ in range(20_000)]) is None
    assert first_loop(span, thue_morse(20_000)) is None  # two symbols, yet never four repeats of anything


def test_a_loop_broken_just_before_the_span_starts_over():
    tokens = [7] * (SPAN - 1) + [8] + [7] * (SPAN - 1)
    assert first_loop(SPAN, tokens) is None
    assert first_loop(SPAN, [*tokens, 7]) == len(tokens) + 1


def periodic_tail(tokens, span):
    """Whether the last `span` tokens repeat some period p <= span // 4, checked from scratch."""
    n = len(tokens)
    return n >= span and any(
        all(tokens[i] == tokens[i - p] for i in range(n - span + p, n)) for p in range(1, span // 4 + 1)
    )


@pytest.mark.parametrize("span", [4, 8, 13, SPAN])
def test_the_detector_fires_exactly_where_the_tail_is_periodic(span):
    """Against a check from scratch after every token, on output from a few symbols with loops spliced in (loops
    that start, break and start again, at every period)."""
    rng = random.Random(span)
    tokens, detector = [], RepetitionDetector(span)
    while len(tokens) < 3000:
        if rng.random() < 0.3:
            period = rng.randint(1, span // 4 + 1)
            motif = [rng.randrange(3) for _ in range(period)]
            tokens_to_add = [motif[i % period] for i in range(rng.randint(1, 2 * span))]
        else:
            tokens_to_add = [rng.randrange(3) for _ in range(rng.randint(1, 10))]
        for token in tokens_to_add:
            tokens.append(token)
            assert detector.push(token) == periodic_tail(tokens, span), (len(tokens), tokens[-span:])


@pytest.mark.parametrize("span", [0, 1, 3])
def test_a_span_with_no_period_of_four_repeats_never_fires(span):
    assert first_loop(span, [9] * 1000) is None


def test_a_negative_span_is_refused_by_the_detector_and_the_limits():
    with pytest.raises(ValueError):
        RepetitionDetector(-1)
    with pytest.raises(ValueError):
        ServingLimits(repetition_span=-1)


# --- a sequence ending by its detector --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(stories_hf_dir):
    return Tokenizer.from_hf_dir(stories_hf_dir)


def looping_sequence(tokenizer, *, span, stop=(), max_tokens=1000):
    seq = Sequence(
        "req",
        [1],
        sampling=None,
        detokenizer=IncrementalDetokenizer(tokenizer),
        options=GenerationOptions(stop=list(stop), max_tokens=max_tokens),
        context_window=10_000,
    )
    seq.repetition = RepetitionDetector(span)
    return seq


def test_a_sequence_ends_as_repetition_loop_and_releases_its_held_text(tokenizer):
    the = tokenizer.encode("the", add_special_tokens=False)
    seq = looping_sequence(tokenizer, span=8, stop=["the end"])  # each "the" is held back: it may start the stop
    pieces = feed(seq, the * 20)
    assert not "".join(pieces[:-1]).endswith("the")  # the last "the" came out only with the finish
    assert (seq.finish_reason, len(seq.output_ids), "".join(pieces)) == (REPETITION_LOOP, 8, tokenizer.decode(the * 8))


def test_a_stop_string_completed_by_the_loops_last_token_wins(tokenizer):
    the = tokenizer.encode("the", add_special_tokens=False)
    seq = looping_sequence(tokenizer, span=4, stop=["the the the the"])
    pieces = feed(seq, the * 10)
    assert (seq.finish_reason, len(seq.output_ids), "".join(pieces)) == (STOP, 4, "")


def test_a_loop_closed_by_the_last_allowed_token_is_reported_over_length(tokenizer):
    the = tokenizer.encode("the", add_special_tokens=False)
    seq = looping_sequence(tokenizer, span=4, max_tokens=4)
    feed(seq, the * 10)
    assert (seq.finish_reason, len(seq.output_ids)) == (REPETITION_LOOP, 4)


# --- the real model, through the scheduler ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=2)


@pytest.fixture(scope="module")
def loop_token(model):
    return model.tokenizer.encode("the", add_special_tokens=False)[0]


def request(model, request_id, *, max_tokens, logit_bias=None):
    return Sequence(
        request_id,
        model.tokenizer.encode("Once upon a time"),
        sampling=SequenceSampling(SamplingParams(temperature=0, logit_bias=logit_bias), model.runner.vocab_size),
        detokenizer=IncrementalDetokenizer(model.tokenizer),
        options=GenerationOptions(max_tokens=max_tokens),
        eos_token_ids=model.eos_token_ids,
        context_window=model.runner.context_window,
    )


def run(scheduler, max_steps=2_000):
    messages = []
    while scheduler.has_work and max_steps:
        messages += scheduler.step()
        max_steps -= 1
    return messages


def outcome(messages, request_id):
    """What the client sees: the tokens and how the generation ended."""
    tokens = [t for m in messages if isinstance(m, Streamed) and m.request_id == request_id for t in m.token_ids]
    done = next(m for m in messages if isinstance(m, Ended) and m.request_id == request_id)
    assert done.completion_tokens == len(tokens)
    return tokens, done.finish_reason


def test_a_biased_greedy_decode_ends_as_a_loop_after_span_tokens(model, loop_token):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=2, repetition_span=SPAN)
    scheduler.add(request(model, "loop", max_tokens=400, logit_bias={loop_token: 100.0}))
    scheduler.add(request(model, "story", max_tokens=24))
    messages = run(scheduler)
    assert outcome(messages, "loop") == ([loop_token] * SPAN, REPETITION_LOOP)
    tokens, reason = outcome(messages, "story")
    assert (len(tokens), reason) == (24, LENGTH)  # a normal decode beside it is untouched
    assert model.runner.cache.num_slots == 0  # both slots are free again


def test_without_a_span_the_same_loop_runs_to_length(model, loop_token):
    scheduler = Scheduler(model.runner, model.tokenizer, repetition_span=0)
    scheduler.add(request(model, "loop", max_tokens=400, logit_bias={loop_token: 100.0}))
    assert outcome(run(scheduler), "loop") == ([loop_token] * 400, LENGTH)


def test_a_loads_serving_limits_arm_the_detector(stories_hf_dir, loop_token):
    limits = ServingLimits(max_concurrent=1, repetition_span=SPAN)
    hosted = HostedModel.load(
        p.Load(request_id="load-1", name="stories", path=str(stories_hf_dir), limits=limits), "cpu"
    )
    sampling = SamplingParams(temperature=0, logit_bias={loop_token: 100.0})
    submit = p.Submit(
        request_id="gen-1",
        model="stories",
        prompt_token_ids=[1, 2, 3],
        sampling=sampling,
        options=GenerationOptions(max_tokens=400),
    )
    hosted.admit(hosted.prepare(submit))
    assert outcome(run(hosted.scheduler), "gen-1") == ([loop_token] * SPAN, REPETITION_LOOP)
