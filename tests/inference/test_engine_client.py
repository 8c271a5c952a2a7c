"""The engine client with its worker loop in a thread (what route tests use): the same answers as the engine itself,
logprobs as the model computes them, refusals with the API's error types, and pause/resume at a step boundary."""

import asyncio
import os

import pytest
import pytest_asyncio

from inference.engine.contract import messages as p
from inference.engine.hosted_model import chat_prompt_ids
from inference.engine.loaders.loading import load_model
from inference.runtime.generation import EngineError
from inference.runtime.in_process_client import InProcessEngineClient
from tests.inference.engine_calls import generate, load, seen_as

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "What did the cat see?"}]
LONG = 500  # tokens: with a 2-token prompt, a generation that runs to near the 512-token window
# Tokens of the generation that times an abort. Started on a second model of the same worker just before the abort,
# it advances one token per worker step, as the aborted generation would: fewer steps than that one has left (so if
# the abort were ignored, the timer ends first), and many more than the worker needs to read an abort.
TIMER_TOKENS = 240


@pytest.fixture(scope="module")
def engine(stories_hf_dir):
    return load_model(stories_hf_dir, max_concurrent=1)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(stories_hf_dir):
    client = InProcessEngineClient()
    await client.start()
    await load(client, "stories", str(stories_hf_dir), max_concurrent=1, queue_depth=1)
    yield client
    await client.close()


@pytest_asyncio.fixture(loop_scope="module")
async def timer(client, stories_hf_dir):
    """A second model on the worker, "timer", to time aborts with (see TIMER_TOKENS)."""
    await load(client, "timer", str(stories_hf_dir))
    yield "timer"
    await client.unload("timer")


async def collect(generation):
    events = [event async for event in generation]
    return [e for e in events if isinstance(e, p.Tokens)], events[-1]


async def models_by_name(client):
    [status] = await client.status()
    return {m.name: m for m in status.models}


async def until_idle_or_timer_ends(client, model):
    """The worker's model statuses, by name, from the first status in which `model` has nothing waiting or running
    or the timer's generation has ended (whichever comes first)."""
    while True:
        models = await models_by_name(client)
        if not (models[model].waiting or models[model].running) or not models["timer"].running:
            return models
        await asyncio.sleep(0.01)


async def test_workers_run_in_this_process(client):
    [status] = await client.status()
    assert status.pid == os.getpid() and status.device == "cpu"


async def test_logprobs_are_the_models_own_for_each_chosen_token(client, engine):
    prompt = chat_prompt_ids(engine, MESSAGES)
    generation = await generate(
        client,
        "stories",
        messages=MESSAGES,
        sampling={"temperature": 0.0, "logprobs": True, "top_logprobs": 3},
        max_tokens=1,
    )
    [tokens], done = await collect(generation)
    assert done.finish_reason == "length" and generation.prompt_tokens == len(prompt)
    slot = engine.runner.allocate_slot()
    expected = engine.runner.prefill(slot, prompt).log_softmax(-1)
    engine.runner.free_slot(slot)
    [lp] = tokens.logprobs
    best = int(expected.argmax())
    assert lp.token_id == tokens.token_ids[0] == best
    assert lp.token == engine.tokenizer.token_bytes(best)
    assert lp.logprob == pytest.approx(float(expected[best]), abs=1e-5)
    assert [t.token_id for t in lp.top] == expected.topk(3).indices.tolist()
    assert lp.top[0].logprob == pytest.approx(lp.logprob)


async def test_refusals_carry_the_api_error_type_and_status(client, stories_hf_dir, tmp_path):
    cases = [
        (generate(client, "nope", messages=MESSAGES), "model_not_found", 404),
        (generate(client, "stories", prompt_token_ids=[1, 99999]), "invalid_request_error", 400),
        (load(client, "stories", str(stories_hf_dir)), "load_failed", 409),
        (load(client, "other", str(tmp_path / "missing.gguf")), "load_failed", 404),
        (client.unload("nope"), "unload_failed", 404),
    ]
    for call, error_type, status in cases:
        with pytest.raises(EngineError) as refused:
            await call
        assert seen_as(refused.value) == (error_type, status), refused.value.message
    assert set(client.models()) == {"stories"}  # the refused load left nothing behind


async def test_pause_waits_for_the_running_sequence_and_holds_the_queue_until_resume(client, timer):
    running = await generate(client, "stories", prompt_token_ids=[1, 300], max_tokens=40, ignore_eos=True)
    pause = asyncio.create_task(client.pause("stories"))
    queued = asyncio.create_task(generate(client, "stories", prompt_token_ids=[1, 301], max_tokens=5))
    tokens, done = await collect(running)
    assert sum(len(t.token_ids) for t in tokens) == 40 and done.finish_reason == "length"
    await asyncio.wait_for(pause, 10)  # answered once nothing runs
    # The worker steps the timer's generation meanwhile, one token a step: many more steps than the queued request
    # would need to take the free slot and finish its 5 tokens, were the queue not held.
    timing = await generate(client, timer, prompt_token_ids=[1, 300], max_tokens=40, ignore_eos=True)
    tokens, done = await collect(timing)
    assert done.completion_tokens == 40
    assert not queued.done()  # admitted to the queue, not to a slot, while paused
    models = await models_by_name(client)
    assert (models["stories"].state, models["stories"].waiting, models["stories"].running) == ("paused", 1, 0)
    await client.resume("stories")
    tokens, done = await collect(await asyncio.wait_for(queued, 10))
    assert done.completion_tokens == 5


async def test_a_request_cancelled_while_queued_gives_up_its_place(client, timer):
    running = await generate(client, "stories", prompt_token_ids=[1, 300], max_tokens=LONG, ignore_eos=True)
    queued = asyncio.create_task(generate(client, "stories", prompt_token_ids=[1, 301], max_tokens=5))
    for _ in range(100):
        models = await models_by_name(client)
        if models["stories"].waiting:
            break
        await asyncio.sleep(0.01)
    assert models["stories"].waiting == 1
    timing = await generate(client, timer, prompt_token_ids=[1, 300], max_tokens=TIMER_TOKENS, ignore_eos=True)
    queued.cancel()  # the HTTP client went away while waiting for a slot
    running.abort()
    models = await until_idle_or_timer_ends(client, "stories")
    assert (models["stories"].waiting, models["stories"].running) == (0, 0)
    assert models[timer].running == 1  # both left long before the running one could have finished by itself
    tokens, done = await collect(timing)
    assert done.completion_tokens == TIMER_TOKENS


async def test_unload_without_force_is_called_off_when_the_drain_times_out(client):
    running = await generate(client, "stories", prompt_token_ids=[1, 300], max_tokens=400, ignore_eos=True)
    await anext(running)
    with pytest.raises(EngineError) as refused:  # no time to drain: a positive drain would race the generation
        await client.unload("stories", drain_timeout=0, force=False)
    assert seen_as(refused.value) == ("unload_failed", 409)
    assert client.models()["stories"].state == "ready"
    tokens, done = await collect(running)  # the generation was left alone
    assert done.completion_tokens == 400


async def test_a_load_that_times_out_leaves_the_name_free(client, stories_hf_dir):
    with pytest.raises(EngineError) as late:
        await load(client, "second", str(stories_hf_dir), timeout=0.001)
    assert seen_as(late.value)[0] == "load_failed" and "second" not in client.models()
    info = await load(client, "second", str(stories_hf_dir))  # not refused as "already loaded"
    assert info.name == "second"
    [status] = await client.status()  # loads run one after another, so the dropped one is gone by now
    assert sorted(m.name for m in status.models) == ["second", "stories"]
    await client.unload("second")


async def test_logit_bias_keyed_by_token_id_reaches_the_sampler(client, engine):
    prompt = chat_prompt_ids(engine, MESSAGES)
    slot = engine.runner.allocate_slot()
    first, second = engine.runner.prefill(slot, prompt).topk(2).indices.tolist()
    engine.runner.free_slot(slot)
    sampling = {"temperature": 0.0, "logit_bias": {first: -100.0}}
    [tokens], _ = await collect(await generate(client, "stories", messages=MESSAGES, sampling=sampling, max_tokens=1))
    assert tokens.token_ids == [second]
