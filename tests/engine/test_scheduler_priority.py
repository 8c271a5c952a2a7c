"""Batch priority in the scheduler, on the real stories260K model in process: interactive sequences take free slots
and the prefill budget before batch ones, batch ones never hold more than `batch_slots` slots, waiting batch ones
never make an interactive request queue_full, and only interactive ones time out in the queue."""

import pytest

from inference.engine.contract.params import GenerationOptions, SamplingParams
from inference.engine.loaders.loading import load_model
from inference.engine.sampler import SequenceSampling
from inference.engine.scheduler import Scheduler
from inference.engine.sequence import Sequence
from inference.engine.step_results import Admitted, Ended, Streamed
from inference.engine.text.detokenizer import IncrementalDetokenizer

PROMPT = "Lily and Tom went to the park. They saw a big dog and"


@pytest.fixture(scope="module")
def model(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=4)


def sequence(model, request_id, *, priority="interactive", max_tokens=8, prompt=PROMPT):
    return Sequence(
        request_id,
        model.tokenizer.encode(prompt),
        sampling=SequenceSampling(SamplingParams(temperature=0.0), model.runner.vocab_size),
        detokenizer=IncrementalDetokenizer(model.tokenizer),
        options=GenerationOptions(max_tokens=max_tokens, ignore_eos=True),
        context_window=model.runner.context_window,
        priority=priority,
    )


def run(scheduler, on_step=None):
    messages = []
    while scheduler.has_work:
        messages += scheduler.step()
        if on_step is not None:
            on_step()
    return messages


def admission_order(messages):
    return [m.request_id for m in messages if isinstance(m, Admitted)]


def test_a_free_slot_goes_to_a_waiting_interactive_sequence_before_an_older_batch_one(model):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=1, queue_depth=4)
    scheduler.add(sequence(model, "running", max_tokens=4))
    messages = scheduler.step()  # it holds the one slot
    scheduler.add(sequence(model, "batch-1", priority="batch"))
    scheduler.add(sequence(model, "batch-2", priority="batch"))
    scheduler.add(sequence(model, "interactive"))  # arrives last, among batch sequences that wait
    messages += run(scheduler)
    assert admission_order(messages) == ["running", "interactive", "batch-1", "batch-2"]
    assert sorted(m.request_id for m in messages if isinstance(m, Ended)) == [
        "batch-1", "batch-2", "interactive", "running"
    ]  # fmt: skip
    assert model.runner.cache.num_slots == 0


def test_batch_sequences_never_hold_more_than_batch_slots_and_interactive_ones_take_the_rest(model):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=4, batch_slots=2, queue_depth=8)
    for i in range(5):
        scheduler.add(sequence(model, f"batch-{i}", priority="batch", max_tokens=12))
    batch_running = []

    def observe():
        batch_running.append(sum(s.priority == "batch" for s in scheduler.running))

    messages = scheduler.step()
    observe()
    assert (len(scheduler.running), len(scheduler.queues["batch"])) == (2, 3)  # two slots stay free for clients
    scheduler.add(sequence(model, "interactive-1", max_tokens=30))
    scheduler.add(sequence(model, "interactive-2", max_tokens=30))
    arrival = scheduler.step()
    observe()
    assert admission_order(arrival) == ["interactive-1", "interactive-2"]  # at once, though batch ones wait
    messages += arrival + run(scheduler, observe)
    assert max(batch_running) == 2
    assert batch_running.count(2) > 1  # the cap held while batch sequences waited, not only at the start
    assert len([m for m in messages if isinstance(m, Ended)]) == 7


def test_interactive_prompts_take_the_prefill_budget_before_batch_prompts(model):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=2, queue_depth=2, prefill_chunk=4)
    # prompts of their own: no cached prefix shortens either prefill
    scheduler.add(sequence(model, "batch", priority="batch", prompt="The sun was warm and the birds sang in the tree"))
    messages = scheduler.step()  # the batch prompt's first chunk: it is older in the batch than what follows
    scheduler.add(sequence(model, "interactive", prompt="Ben had a red ball. He liked to throw it to his dog"))
    messages += run(scheduler)
    first_tokens = [m.request_id for m in messages if isinstance(m, Streamed) and m.token_ids]
    assert admission_order(messages) == ["batch", "interactive"]
    assert first_tokens[0] == "interactive"  # its whole prompt went in before the rest of the batch one's


def test_waiting_batch_sequences_do_not_fill_the_interactive_line(model):
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=2, batch_slots=1, queue_depth=1)
    scheduler.add(sequence(model, "batch-1", priority="batch", max_tokens=20))
    scheduler.add(sequence(model, "batch-2", priority="batch", max_tokens=20))
    scheduler.step()  # batch-1 runs in its one slot, batch-2 takes the batch line's one place
    assert scheduler.is_full("batch")
    assert not scheduler.is_full()
    scheduler.add(sequence(model, "interactive-1", max_tokens=20))
    scheduler.step()  # interactive-1 takes the free slot: every slot is busy now
    assert not scheduler.is_full()  # the interactive line's one place is still free
    scheduler.add(sequence(model, "interactive-2", max_tokens=20))
    assert scheduler.is_full()
    messages = run(scheduler)
    assert admission_order(messages) == ["interactive-2", "batch-2"]


def test_only_interactive_sequences_time_out_in_the_queue(model):
    now = [0.0]
    scheduler = Scheduler(model.runner, model.tokenizer, max_concurrent=1, queue_depth=2, queue_timeout=1.0,
                          clock=lambda: now[0])  # fmt: skip
    scheduler.add(sequence(model, "running", max_tokens=50))
    scheduler.step()
    scheduler.add(sequence(model, "batch", priority="batch"))
    scheduler.add(sequence(model, "interactive"))
    now[0] = 5.0
    assert [e.request_id for e in scheduler.expire_waiting()] == ["interactive"]
    assert [s.request_id for s in scheduler.waiting] == ["batch"]
    assert "batch" in admission_order(run(scheduler))
