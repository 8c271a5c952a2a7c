"""Admission in the worker, through the engine client with the worker loop in a thread: a SUBMIT the worker cannot
read still fails its own request (no hang), low free memory refuses new generations with 503
server_memory_constrained, and a load whose configured window does not fit in memory gets a shorter one."""

import asyncio

import psutil
import pytest
import pytest_asyncio

from inference.engine import worker as worker_module
from inference.engine.contract import messages as p
from inference.engine.contract.params import GenerationOptions, ServingLimits
from inference.engine.hosted_model import HostedModel, RequestRefused
from inference.engine.kv_budget import (
    PREFIX_CACHE_CAP,
    PREFIX_CACHE_SHARE,
    configured_window,
    effective_window,
    kv_bytes_per_token,
    prefix_cache_bytes,
    read_config,
    weight_bytes_estimate,
)
from inference.engine.loaders.loading import load_model
from inference.runtime.generation import EngineError
from inference.runtime.in_process_client import InProcessEngineClient
from inference.services.refusals import as_api_error
from tests.inference.engine_calls import generate, load, seen_as, submit

in_module_loop = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "What did the cat see?"}]


class SubmitFromANewerClient(p.Submit, tag="S"):
    """A SUBMIT with one field more than this worker knows (a control plane and worker of different versions)."""

    grammar: str = "json"


class SubmitWithLooseSampling(p.Submit, tag="S"):
    """A SUBMIT whose sampling is whatever the sender put there, as a buggy or hostile client could send it."""

    sampling: dict = {}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(stories_hf_dir):
    client = InProcessEngineClient()
    await client.start()
    await load(client, "stories", str(stories_hf_dir), max_concurrent=2, queue_depth=2)
    yield client
    await client.close()


@in_module_loop
async def test_a_submit_the_worker_cannot_read_fails_that_request_instead_of_hanging(client):
    submit = SubmitFromANewerClient(request_id="unreadable-1", model="stories", messages=MESSAGES)
    with pytest.raises(EngineError) as refused:
        await asyncio.wait_for(client.submit("cpu", submit), timeout=5)
    assert seen_as(refused.value) == ("invalid_request_error", 400)
    assert "bad message" in refused.value.message
    # The worker serves on.
    generation = await generate(client, "stories", messages=MESSAGES, max_tokens=3, sampling={"temperature": 0})
    events = [e async for e in generation]
    assert isinstance(events[-1], p.Finished)


@in_module_loop
async def test_a_mistyped_sampling_field_fails_its_request_alone_beside_two_good_ones(client):
    good = [submit("stories", prompt_token_ids=[1, 300 + i], max_tokens=8, ignore_eos=True) for i in range(2)]
    bad = SubmitWithLooseSampling(
        request_id="bad-top-k", model="stories", prompt_token_ids=[1, 302], sampling={"top_k": "5"}
    )
    first, refused, second = await asyncio.gather(
        client.submit("cpu", good[0]), client.submit("cpu", bad), client.submit("cpu", good[1]), return_exceptions=True
    )
    assert isinstance(refused, EngineError) and seen_as(refused) == ("invalid_request_error", 400)
    assert "top_k" in refused.message
    for generation in (first, second):
        events = [e async for e in generation]
        assert isinstance(events[-1], p.Finished) and events[-1].completion_tokens == 8


@in_module_loop
async def test_a_load_with_no_room_for_its_kv_cache_fails_with_507(client, stories_hf_dir):
    reserve = psutil.virtual_memory().total * 4  # more than this host can ever have free
    with pytest.raises(EngineError) as failed:
        await load(client, "tight", str(stories_hf_dir), max_concurrent=1, min_free_memory=reserve)
    assert seen_as(failed.value) == ("load_failed", 507)
    assert "KV cache" in failed.value.message
    assert "tight" not in client.models()


def test_low_free_memory_refuses_a_new_generation_with_503(stories_hf_dir):
    load = p.Load(request_id="load-1", name="stories", path=str(stories_hf_dir), limits=ServingLimits(max_concurrent=1))
    hosted = HostedModel.load(load, "cpu")
    hosted.admit(
        hosted.prepare(
            p.Submit(request_id="gen-1", model="stories", messages=MESSAGES, options=GenerationOptions(max_tokens=2))
        )
    )
    assert len(hosted.scheduler.waiting) == 1
    hosted.min_free_memory = psutil.virtual_memory().total * 4  # the host dropped below the reserve
    with pytest.raises(RequestRefused) as refused:
        hosted.admit(
            hosted.prepare(
                p.Submit(
                    request_id="gen-2", model="stories", messages=MESSAGES, options=GenerationOptions(max_tokens=2)
                )
            )
        )
    error = refused.value.error
    assert (error.request_id, *seen_as(EngineError.from_error(error))) == ("gen-2", "server_memory_constrained", 503)
    assert int(as_api_error(EngineError.from_error(error)).headers["Retry-After"]) > 0
    assert [s.request_id for s in hosted.scheduler.waiting] == ["gen-1"]  # nothing queued for it


def test_the_window_is_the_longest_whose_kv_cache_fits(stories_hf_dir):
    config = read_config(stories_hf_dir)
    per_token = kv_bytes_per_token(config, 4)
    assert per_token == 2 * 5 * 4 * 8 * 4  # keys and values x layers x kv heads x head_dim x float32
    assert configured_window(config, 0) == 512 and configured_window(config, 100) == 100
    # The KV pool load_model really allocates for 4 sequences x 512 positions is per_token x 4 x 512 bytes, plus
    # one scratch block (where a batched prefill's padding goes).
    model = load_model(stories_hf_dir, max_concurrent=4, context_window=512)
    cache = model.runner.cache
    positions = 4 * 512 + cache.block_size
    assert sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values]) == per_token * positions
    assert weight_bytes_estimate(config, 4) >= model.weight_bytes
    assert effective_window(512, per_token, 4, per_token * 4 * 512) == 512
    assert effective_window(512, per_token, 4, per_token * 4 * 300 + per_token) == 300
    assert effective_window(512, per_token, 4, 10**12) == 512
    assert effective_window(512, per_token, 4, -5) == 0


def test_the_prefix_cache_gets_its_bytes_beyond_the_windows_never_more_than_fits(stories_hf_dir):
    assert prefix_cache_bytes(None, 64 * 2**30) == PREFIX_CACHE_CAP  # automatic: capped...
    assert prefix_cache_bytes(None, 2**30) == 2**30 // PREFIX_CACHE_SHARE  # ...and a share of what is left
    assert prefix_cache_bytes(10**6, 2**30) == 10**6  # asked for: as asked...
    assert prefix_cache_bytes(10**15, 2**30) == 2**30 and prefix_cache_bytes(None, -5) == 0  # ...as memory allows
    per_block = kv_bytes_per_token(read_config(stories_hf_dir), 4) * 16
    limits = ServingLimits(max_concurrent=2, prefix_cache_bytes=100 * per_block + per_block // 2)
    hosted = HostedModel.load(
        p.Load(request_id="load-1", name="stories", path=str(stories_hf_dir), limits=limits), "cpu"
    )
    pool = hosted.model.runner.cache.pool
    assert pool.num_blocks == 2 * 512 // 16 + 100  # the two windows, then 100 whole blocks of cache
    assert hosted.status().prefix_cache_bytes == 100 * per_block
    assert hosted.kv_bytes == (2 * 512 // 16 + 1) * per_block  # the windows' blocks and the scratch one


@in_module_loop
async def test_loaded_reports_the_configured_and_the_effective_window(client, stories_hf_dir):
    loaded = await load(client, "capped", str(stories_hf_dir), max_concurrent=1, ctx_cap=64)
    try:
        assert (loaded.context_window_configured, loaded.context_window) == (64, 64)
    finally:
        await client.unload("capped", drain_timeout=0)
    info = client.models()["stories"].info
    assert (info.context_window_configured, info.context_window) == (512, 512)


@in_module_loop
async def test_a_prompt_too_long_by_its_text_alone_is_refused_before_it_is_tokenized(client):
    hosted_window = client.models()["stories"].info.context_window
    tokenized = [{"role": "user", "content": "Once upon a time there was a cat. " * 200}]  # under the text bound
    with pytest.raises(EngineError) as counted:
        await generate(client, "stories", messages=tokenized, max_tokens=2)
    assert seen_as(counted.value) == ("context_over_budget", 422)
    assert counted.value.kv_used > hosted_window and "at least" not in counted.value.message  # an exact count
    untokenized = [{"role": "user", "content": "x" * 1_000_000}]
    with pytest.raises(EngineError) as bounded:
        await generate(client, "stories", messages=untokenized, max_tokens=2)
    assert seen_as(bounded.value) == ("context_over_budget", 422)
    assert "at least" in bounded.value.message and bounded.value.kv_used > hosted_window  # a lower bound


@in_module_loop
async def test_an_embeddings_input_too_long_by_its_text_or_length_alone_is_refused_before_it_is_tokenized(client):
    window = client.models()["stories"].info.context_window
    for inputs in (["x" * 1_000_000], ["Hi", "x" * 1_000_000], [[5] * 1_000_000], [[5, 6], [5] * (window + 1)]):
        with pytest.raises(EngineError) as refused:
            await client.embed("stories", inputs)
        assert seen_as(refused.value) == ("context_over_budget", 422)
        assert "at least" in refused.value.message and refused.value.kv_used > window  # no token was counted
    with pytest.raises(EngineError) as counted:  # under the text bound: tokenized, then refused by its count
        await client.embed("stories", ["Once upon a time there was a cat. " * 200])
    assert seen_as(counted.value) == ("context_over_budget", 422) and "at least" not in counted.value.message


@in_module_loop
async def test_embeddings_tokenized_on_the_preparation_thread_equal_those_tokenized_on_the_loop(client, monkeypatch):
    texts = ["Once upon a time there was a cat.", "The sun was warm."]
    inline = await client.embed("stories", texts)
    monkeypatch.setattr(worker_module, "INLINE_PREPARE_BYTES", 0)  # every input goes to the thread
    prepared = await asyncio.wait_for(asyncio.gather(*(client.embed("stories", texts) for _ in range(2))), 60)
    assert [reply.vectors for reply in prepared] == [inline.vectors] * 2
    assert [reply.prompt_tokens for reply in prepared] == [inline.prompt_tokens] * 2


@in_module_loop
async def test_a_prompt_prepared_on_the_preparation_thread_generates_what_the_loop_would(client, monkeypatch):
    async def greedy_tokens() -> list[int]:
        generation = await generate(client, "stories", messages=MESSAGES, max_tokens=12, sampling={"temperature": 0})
        return [t for e in [e async for e in generation] if isinstance(e, p.Tokens) for t in e.token_ids]

    inline = await greedy_tokens()
    monkeypatch.setattr(worker_module, "INLINE_PREPARE_BYTES", 0)  # every chat prompt goes to the thread
    prepared = await asyncio.wait_for(asyncio.gather(*(greedy_tokens() for _ in range(2))), 60)  # a hang guard
    assert prepared == [inline, inline] and len(inline) == 12
