"""Real worker processes serving stories260K through the engine client, supervised as `manage.py serve` runs them:
load, stream, abort, status, unload with a drain, and a worker killed (or hung) mid-generation: the stream ends
with WorkerDied at once, the crash hook runs, the worker comes back with its model and serves again."""

import asyncio
import os
import signal
import time

import pytest
import pytest_asyncio

from inference.engine.contract import messages as p
from inference.engine.hosted_model import chat_prompt_ids
from inference.engine.loaders.loading import load_model
from inference.runtime.generation import EngineError, WorkerDied
from inference.runtime.supervisor import WorkerSupervisor
from tests.greedy import greedy
from tests.inference.engine_calls import generate, load, seen_as

pytestmark = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "Tell me a story about Lily."}]
GREEDY = {"temperature": 0.0}
LONG = 500  # tokens: with a 2-token prompt, a generation that runs to near the 512-token window
# Tokens of the generation that times an abort. Started on a second model of the same worker just before the abort,
# it advances one token per worker step, as the aborted generation would: fewer steps than that one has left (so if
# the abort were ignored, the timer ends first), and many more than the worker needs to read an abort.
TIMER_TOKENS = 240


@pytest.fixture(scope="module")
def reference(stories_hf_dir):
    """What the engine itself generates greedily for MESSAGES (prompt ids, output ids, text), through the runner."""
    model = load_model(stories_hf_dir, max_concurrent=1)
    prompt = chat_prompt_ids(model, MESSAGES)
    out = greedy(model.runner, prompt, 20, stop=model.eos_token_ids).tokens
    return prompt, out, model.tokenizer.decode(out)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def supervisor():
    crashes = []
    supervisor = WorkerSupervisor(devices=["cpu"], on_crash=crashes.append, heartbeat_timeout=3.0)
    supervisor.crashes = crashes
    await supervisor.start()
    yield supervisor
    await supervisor.stop()
    assert all(w.process.poll() is not None for w in supervisor.workers.values())


@pytest_asyncio.fixture(loop_scope="module")
async def client(supervisor, stories_hf_dir):
    """The supervisor's client with stories260K loaded as "stories" (loaded again if a test unloaded it)."""
    client = supervisor.client
    if "stories" not in client.models():
        await load(client, "stories", str(stories_hf_dir), device="cpu")
    return client


@pytest_asyncio.fixture(loop_scope="module")
async def timer(client, stories_hf_dir):
    """A second model on the worker, "timer", to time aborts with (see TIMER_TOKENS)."""
    await load(client, "timer", str(stories_hf_dir), device="cpu")
    yield "timer"
    await client.unload("timer")


async def collect(generation):
    tokens, text, done = [], "", None
    async for event in generation:
        if isinstance(event, p.Tokens):
            tokens += event.token_ids
            text += event.text
        else:
            done = event
    return tokens, text, done


async def models_by_name(client):
    [status] = await client.status()
    return {m.name: m for m in status.models}


async def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_streamed_chat_equals_the_engines_own_greedy_output(client, reference, stories_hf_dir):
    prompt, expected, expected_text = reference
    info = client.models()["stories"].info
    assert (info.format, info.architecture, info.context_window, info.max_concurrent) == ("hf", "llama", 512, 1)
    generation = await generate(client, "stories", messages=MESSAGES, sampling=GREEDY, max_tokens=20)
    assert generation.prompt_tokens == len(prompt)
    tokens, text, done = await collect(generation)
    assert tokens == expected and text == expected_text
    assert done.prompt_tokens == len(prompt) and done.completion_tokens == len(expected)
    assert done.kv_cap == 512 and done.cached_tokens == 0


async def test_status_reports_the_model_and_its_slots(client):
    [status] = await client.status()
    assert status.device == "cpu" and status.pid == client.workers()["cpu"].pid
    assert status.memory_total > status.memory_used > 0
    [model] = status.models
    assert (model.name, model.state, model.slots_used, model.slots_total) == ("stories", "ready", 0, 1)
    assert model.weight_bytes > 1_000_000 and model.kv_bytes > 0


async def test_abort_frees_the_slot_and_a_second_request_is_busy_meanwhile(client, timer, reference):
    prompt = reference[0]
    generation = await generate(client, "stories", prompt_token_ids=[1, 300], max_tokens=LONG, ignore_eos=True)
    await anext(generation)
    with pytest.raises(EngineError) as busy:  # the load's one slot is taken
        await generate(client, "stories", prompt_token_ids=prompt, max_tokens=5)
    assert seen_as(busy.value) == ("server_busy", 429)
    assert (await models_by_name(client))["stories"].slots_used == 1
    timing = await generate(client, timer, prompt_token_ids=[1, 300], max_tokens=TIMER_TOKENS, ignore_eos=True)
    generation.abort()
    while True:  # the worker frees the slot when it reads the abort, before its next step
        models = await models_by_name(client)
        if models["stories"].slots_used == 0 or not models[timer].running:
            break
        await asyncio.sleep(0.02)
    assert models["stories"].slots_used == 0
    assert models[timer].running == 1  # freed long before the generation could have finished by itself
    tokens, _, done = await collect(timing)
    assert len(tokens) == TIMER_TOKENS and done.finish_reason == "length"
    tokens, _, done = await collect(await generate(client, "stories", prompt_token_ids=prompt, max_tokens=3))
    assert len(tokens) == 3 and done.finish_reason == "length"


async def test_a_prompt_over_the_window_is_refused_before_any_prefill(client):
    with pytest.raises(EngineError) as refused:
        await generate(client, "stories", prompt_token_ids=[1] + [300] * 511, max_tokens=5)
    error = refused.value
    assert (*seen_as(error), error.kv_used, error.kv_cap) == ("context_over_budget", 422, 512, 512)


async def test_unload_drains_a_running_generation_then_frees_the_model(client, reference):
    generation = await generate(client, "stories", prompt_token_ids=reference[0], max_tokens=30, ignore_eos=True)
    unload = asyncio.create_task(client.unload("stories", drain_timeout=30))
    tokens, _, done = await collect(generation)
    assert len(tokens) == 30 and done.finish_reason == "length"  # finished, not cut off
    assert (await unload).aborted == 0
    assert "stories" not in client.models()
    [status] = await client.status()
    assert status.models == []


async def test_unload_past_its_drain_timeout_ends_the_generation_with_an_error(client, reference):
    generation = await generate(client, "stories", prompt_token_ids=reference[0], max_tokens=480, ignore_eos=True)
    await anext(generation)
    # no time to drain: a positive drain would race the generation, which a fast enough worker finishes within it
    unloaded = await client.unload("stories", drain_timeout=0)
    assert unloaded.aborted == 1
    with pytest.raises(EngineError) as ended:
        await collect(generation)
    assert ended.value.reason == "model_unloaded"


async def test_killed_worker_fails_its_stream_fast_restarts_and_serves_its_model_again(supervisor, client, reference):
    worker = supervisor.workers["cpu"]
    old_pid, restarts = worker.process.pid, worker.restarts
    started = time.monotonic()
    await collect(await generate(client, "stories", messages=MESSAGES, max_tokens=480, ignore_eos=True))
    full = time.monotonic() - started  # how long the whole generation takes on this worker
    generation = await generate(client, "stories", messages=MESSAGES, max_tokens=480, ignore_eos=True)
    await anext(generation)
    killed_at = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(WorkerDied):
        async with asyncio.timeout(60):  # a hang guard; how soon is judged below
            await collect(generation)
    assert time.monotonic() - killed_at < full / 2  # ended long before the generation could have finished by itself
    with pytest.raises(WorkerDied):  # while it is down, the model fails fast too
        await generate(client, "stories", messages=MESSAGES, max_tokens=5)
    await wait_until(lambda: supervisor.crashes, 5)
    crash = supervisor.crashes[-1]
    assert (crash.device, crash.pid, crash.returncode, crash.models) == ("cpu", old_pid, -signal.SIGKILL, ["stories"])

    await wait_until(lambda: client.models().get("stories") and client.models()["stories"].state == "ready", 90)
    [info] = supervisor.describe()
    assert (info.device, info.state, info.restarts) == ("cpu", "ready", restarts + 1) and info.pid != old_pid
    heard = info.last_heartbeat  # the new worker's last message (the reload's answer, or a heartbeat since)
    await wait_until(lambda: (supervisor.describe()[0].last_heartbeat or 0) > heard, 30)  # idle, it heartbeats...
    assert supervisor.describe()[0].pid == info.pid  # ...itself, rather than being replaced for its silence
    assert supervisor.placements() == {"stories": "cpu"}
    _, text, _ = await collect(await generate(client, "stories", messages=MESSAGES, sampling=GREEDY, max_tokens=20))
    assert text == reference[2]


async def test_a_hung_worker_is_detected_by_its_heartbeats_and_replaced(supervisor, client):
    old_pid = supervisor.workers["cpu"].process.pid
    generation = await generate(client, "stories", messages=MESSAGES, max_tokens=480, ignore_eos=True)
    await anext(generation)
    os.kill(old_pid, signal.SIGSTOP)  # alive but silent
    with pytest.raises(WorkerDied):
        async with asyncio.timeout(supervisor.heartbeat_timeout + 5):
            await collect(generation)
    await wait_until(lambda: client.models().get("stories") and client.models()["stories"].state == "ready", 90)
    assert supervisor.workers["cpu"].process.pid != old_pid
    tokens, _, _ = await collect(await generate(client, "stories", messages=MESSAGES, max_tokens=3))
    assert len(tokens) == 3
