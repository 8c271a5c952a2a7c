"""The scheduler on the real stories260K model, in process: what it generates equals plain greedy decoding through
the runner, alone, chunked and batched; aborting frees the KV slot at once; the context window, the queue and
pausing behave as a client would notice."""

import pytest

from inference.engine.contract.params import GenerationOptions, SamplingParams
from inference.engine.contract.reasons import Reason
from inference.engine.loaders.loading import load_model
from inference.engine.sampler import SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence
from inference.engine.step_results import Admitted, Ended, Streamed
from inference.engine.step_wire import wire_messages
from inference.engine.text.detokenizer import IncrementalDetokenizer
from tests.greedy import greedy

PROMPTS = ["Once upon a time", "Lily and Tom went to the park. They saw a big dog and", "The sun", "One day, a cat"]


@pytest.fixture(scope="module")
def model(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=4)


def sequence(model, request_id, prompt_ids, *, max_tokens=40, stop=(), temperature=0.0, window=None):
    return Sequence(
        request_id,
        prompt_ids,
        sampling=SequenceSampling(SamplingParams(temperature=temperature, seed=7), model.runner.vocab_size),
        detokenizer=IncrementalDetokenizer(model.tokenizer),
        options=GenerationOptions(stop=list(stop), max_tokens=max_tokens),
        eos_token_ids=model.eos_token_ids,
        context_window=window or model.runner.context_window,
    )


def run(scheduler, max_steps=10_000):
    messages = []
    for _ in range(max_steps):
        if not scheduler.has_work:
            break
        messages += scheduler.step()
    return messages


def tokens_of(messages, request_id):
    return [t for m in messages if isinstance(m, Streamed) and m.request_id == request_id for t in m.token_ids]


def text_of(messages, request_id):
    return "".join(m.text for m in messages if isinstance(m, Streamed) and m.request_id == request_id)


def finished(messages, request_id):
    return next(m for m in messages if isinstance(m, Ended) and m.request_id == request_id)


def test_greedy_output_equals_plain_runner_decoding_with_chunked_prefill(model):
    prompt = model.tokenizer.encode(PROMPTS[1])
    expected = greedy(model.runner, prompt, 40, stop=model.eos_token_ids).tokens
    scheduler = Scheduler(model.runner, model.tokenizer, prefill_chunk=4)  # the prompt takes several chunks
    scheduler.add(sequence(model, "a", prompt))
    messages = run(scheduler)
    assert isinstance(messages[0], Admitted) and messages[0].prompt_tokens == len(prompt)
    assert tokens_of(messages, "a") == expected
    assert text_of(messages, "a") == model.tokenizer.decode(expected)
    done = finished(messages, "a")
    assert (done.prompt_tokens, done.completion_tokens) == (len(prompt), len(expected))
    assert done.finish_reason == ("stop" if expected[-1] in model.eos_token_ids else "length")
    assert scheduler.runner.cache.num_slots == 0  # every slot free again


def test_batched_sequences_each_equal_their_own_greedy_decoding(model):
    prompts = [model.tokenizer.encode(text) for text in PROMPTS]
    expected = [greedy(model.runner, ids, 30, stop=model.eos_token_ids).tokens for ids in prompts]
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=4, prefill_chunk=8)
    for i, ids in enumerate(prompts):
        scheduler.add(sequence(model, str(i), ids, max_tokens=30))
    batch_sizes = []
    messages = []
    while scheduler.has_work:
        messages += scheduler.step()
        batch_sizes.append(sum(1 for s in scheduler.running if s.output_ids))
    assert max(batch_sizes) == 4  # they really decoded together
    for i in range(len(prompts)):
        assert tokens_of(messages, str(i)) == expected[i]


def test_an_arrival_is_prefilled_in_the_same_forward_pass_as_the_running_decode(model):
    prompts = [model.tokenizer.encode(text) for text in PROMPTS[:2]]
    expected = [greedy(model.runner, ids, 20, stop=model.eos_token_ids).tokens for ids in prompts]
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=2)
    scheduler.add(sequence(model, "running", prompts[0], max_tokens=20))
    messages = scheduler.step() + scheduler.step()  # its prompt, then its first decode
    passes = []
    hook = model.runner.model.register_forward_hook(lambda *_: passes.append(1))
    try:
        scheduler.add(sequence(model, "arrival", prompts[1], max_tokens=20))
        arrival_step = scheduler.step()
    finally:
        hook.remove()
    assert len(passes) == 1  # the arrival's prompt and the running row read the weights once between them
    assert {m.request_id for m in arrival_step if isinstance(m, Streamed)} == {"running", "arrival"}
    messages += arrival_step + run(scheduler)
    assert [tokens_of(messages, "running"), tokens_of(messages, "arrival")] == expected


def test_abort_frees_the_slot_at_once_and_the_next_request_runs(model):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=1)
    prompt = model.tokenizer.encode(PROMPTS[0])
    scheduler.add(sequence(model, "long", prompt, max_tokens=400))
    for _ in range(5):
        scheduler.step()
    slot = scheduler.running[0].slot
    assert model.runner.slot_length(slot) > len(prompt)
    assert scheduler.abort("long").request_id == "long"
    assert not scheduler.running and not scheduler.has_work
    assert model.runner.cache.num_slots == 0  # the KV slot is free now, not at the next step
    assert scheduler.abort("long") is None  # idempotent
    scheduler.add(sequence(model, "next", prompt, max_tokens=10))
    assert tokens_of(run(scheduler), "next") == greedy(model.runner, prompt, 10, stop=model.eos_token_ids).tokens


def test_generation_that_reaches_the_context_window_ends_with_length(stories_hf_dir):
    small = load_model(stories_hf_dir, max_concurrent=1, context_window=24)
    scheduler = Scheduler(small.runner, small.tokenizer)
    prompt = small.tokenizer.encode(PROMPTS[1])  # 16 tokens with BOS
    seq = sequence(small, "w", prompt, max_tokens=1000)
    seq.stop_token_ids = frozenset()  # run into the window whatever the model says
    scheduler.add(seq)
    done = finished(run(scheduler), "w")
    assert done.finish_reason == "length"
    assert done.kv_used == done.kv_cap == 24
    assert done.completion_tokens == 24 - len(prompt)


def test_a_stop_string_ends_the_generation_without_sending_it(model):
    prompt = model.tokenizer.encode(PROMPTS[0])
    reference = model.tokenizer.decode(greedy(model.runner, prompt, 40, stop=model.eos_token_ids).tokens)
    stop = reference[20:27]
    scheduler = Scheduler(model.runner, model.tokenizer)
    scheduler.add(sequence(model, "s", prompt, stop=[stop]))
    messages = run(scheduler)
    assert text_of(messages, "s") == reference[: reference.index(stop)]
    assert finished(messages, "s").finish_reason == "stop"


def test_queue_runs_in_order_and_refuses_after_the_queue_timeout(model):
    now = [0.0]
    scheduler = Scheduler(model.runner, model.tokenizer, queue_depth=2, queue_timeout=30, clock=lambda: now[0])
    prompt = model.tokenizer.encode(PROMPTS[2])
    for name in "abc":
        assert not scheduler.is_full()
        scheduler.add(sequence(model, name, prompt, max_tokens=5))
    assert scheduler.is_full()
    first = scheduler.step()
    assert [m.request_id for m in first if isinstance(m, Admitted)] == ["a"]
    now[0] = 31.0
    expired = scheduler.expire_waiting()
    refusals = [(m.request_id, m.reason) for m in wire_messages(expired)]  # what the worker sends
    assert refusals == [("b", Reason.QUEUE_TIMEOUT), ("c", Reason.QUEUE_TIMEOUT)]
    assert finished(run(scheduler), "a").completion_tokens == 5


def test_pause_lets_running_finish_and_holds_the_queue_until_resume(model):
    scheduler = Scheduler(model.runner, model.tokenizer, queue_depth=1)
    prompt = model.tokenizer.encode(PROMPTS[3])
    scheduler.add(sequence(model, "running", prompt, max_tokens=8))
    scheduler.step()
    scheduler.pause()
    scheduler.add(sequence(model, "held", prompt, max_tokens=8))
    messages = run(scheduler)
    assert finished(messages, "running").completion_tokens == 8
    assert not any(m.request_id == "held" for m in messages)
    assert not scheduler.running and len(scheduler.waiting) == 1 and not scheduler.has_work
    scheduler.resume()
    assert finished(run(scheduler), "held").completion_tokens == 8


def test_a_scored_prompt_gets_the_teacher_forced_logprob_of_every_token_across_chunks(model):
    prompt = model.tokenizer.encode(PROMPTS[1], add_special_tokens=True)
    slot = model.runner.allocate_slot()
    reference = model.runner.prefill(slot, prompt, all_logits=True).log_softmax(-1)  # [S, V], one pass
    model.runner.free_slot(slot)
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=2, prefill_chunk=5)
    seq = Sequence(
        "scored",
        prompt,
        sampling=SequenceSampling(SamplingParams(), model.runner.vocab_size),
        detokenizer=IncrementalDetokenizer(model.tokenizer),
        options=GenerationOptions(max_tokens=0),
        prompt_logprobs=2,
        context_window=model.runner.context_window,
    )
    scheduler.add(seq)
    messages = run(scheduler)
    done = finished(messages, "scored")
    assert done.completion_tokens == 0 and done.finish_reason == "length" and tokens_of(messages, "scored") == []
    (scored,) = [m for m in messages if isinstance(m, Streamed) and m.prompt_logprobs is not None]
    entries = scored.prompt_logprobs
    assert [e.token_id for e in entries] == prompt and entries[0].logprob is None
    for position, entry in enumerate(entries[1:], start=1):
        assert entry.logprob == pytest.approx(reference[position - 1, prompt[position]].item(), abs=1e-4)
        assert [t.token_id for t in entry.top] == reference[position - 1].topk(2).indices.tolist()
    assert "".join(e.text for e in entries) == model.tokenizer.decode(prompt)  # the entries spell the prompt
