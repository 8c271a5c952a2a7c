"""Admission in the worker, through the engine client with the worker loop in a thread: a SUBMIT the worker cannot
read still fails its own request (no hang), low free memory refuses new generations with 503
server_memory_constrained, and a load whose configured window does not fit in memory gets a shorter one."""

import asyncio
from dataclasses import dataclass

import psutil
import pytest
import pytest_asyncio

from inference.engine.contract import messages as p
from inference.engine.hosted_model import HostedModel, RequestRefused
from inference.engine.kv_budget import (
    configured_window,
    effective_window,
    kv_bytes_per_token,
    read_config,
    weight_bytes_estimate,
)
from inference.engine.loaders.loading import load_model
from inference.runtime.engine_client import EngineError
from inference.runtime.in_process_client import InProcessEngineClient

in_module_loop = pytest.mark.asyncio(loop_scope="module")

MESSAGES = [{"role": "user", "content": "What did the cat see?"}]


@dataclass(slots=True)
class SubmitFromANewerClient(p.Submit):
    """A SUBMIT with one field more than this worker knows (a control plane and worker of different versions)."""

    grammar: str = "json"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(stories_hf_dir):
    client = InProcessEngineClient()
    await client.start()
    await client.load("stories", str(stories_hf_dir), max_concurrent=2, queue_depth=2)
    yield client
    await client.close()


@in_module_loop
async def test_a_submit_the_worker_cannot_read_fails_that_request_instead_of_hanging(client):
    submit = SubmitFromANewerClient("unreadable-1", "stories", MESSAGES)
    with pytest.raises(EngineError) as refused:
        await asyncio.wait_for(client.submit("cpu", submit), timeout=5)
    assert refused.value.type == "invalid_request_error" and refused.value.status == 400
    assert "Submit" in refused.value.message
    # The worker serves on.
    generation = await client.generate("stories", messages=MESSAGES, max_tokens=3, sampling={"temperature": 0})
    events = [e async for e in generation]
    assert isinstance(events[-1], p.Finished)


@in_module_loop
async def test_a_load_with_no_room_for_its_kv_cache_fails_with_507(client, stories_hf_dir):
    reserve = psutil.virtual_memory().total * 4  # more than this host can ever have free
    with pytest.raises(EngineError) as failed:
        await client.load("tight", str(stories_hf_dir), max_concurrent=1, min_free_memory=reserve)
    assert failed.value.type == "load_failed" and failed.value.status == 507
    assert "KV cache" in failed.value.message
    assert "tight" not in client.models()


def test_low_free_memory_refuses_a_new_generation_with_503(stories_hf_dir):
    hosted = HostedModel.load(p.Load("load-1", "stories", str(stories_hf_dir), max_concurrent=1), "cpu")
    submit = p.Submit("gen-1", "stories", MESSAGES, max_tokens=2)
    hosted.admit(submit)
    assert len(hosted.scheduler.waiting) == 1
    hosted.min_free_memory = psutil.virtual_memory().total * 4  # the host dropped below the reserve
    with pytest.raises(RequestRefused) as refused:
        hosted.admit(p.Submit("gen-2", "stories", MESSAGES, max_tokens=2))
    error = refused.value.error
    assert (error.request_id, error.type, error.status) == ("gen-2", "server_memory_constrained", 503)
    assert error.retry_after and error.retry_after > 0
    assert [s.request_id for s in hosted.scheduler.waiting] == ["gen-1"]  # nothing queued for it


def test_the_window_is_the_longest_whose_kv_cache_fits(stories_hf_dir):
    config = read_config(stories_hf_dir)
    per_token = kv_bytes_per_token(config, 4)
    assert per_token == 2 * 5 * 4 * 8 * 4  # keys and values x layers x kv heads x head_dim x float32
    assert configured_window(config, 0) == 512 and configured_window(config, 100) == 100
    # The KV cache load_model really allocates for 4 slots x 512 positions is per_token x 4 x 512 bytes.
    model = load_model(stories_hf_dir, max_slots=4, max_context=512)
    cache = model.runner.cache
    assert sum(t.numel() * t.element_size() for t in [*cache.keys, *cache.values]) == per_token * 4 * 512
    assert weight_bytes_estimate(config, 4) >= model.weight_bytes
    assert effective_window(512, per_token, 4, per_token * 4 * 512) == 512
    assert effective_window(512, per_token, 4, per_token * 4 * 300 + per_token) == 300
    assert effective_window(512, per_token, 4, 10**12) == 512
    assert effective_window(512, per_token, 4, -5) == 0


@in_module_loop
async def test_loaded_reports_the_configured_and_the_effective_window(client, stories_hf_dir):
    loaded = await client.load("capped", str(stories_hf_dir), max_concurrent=1, max_context=64)
    try:
        assert (loaded.context_window_configured, loaded.context_window) == (64, 64)
    finally:
        await client.unload("capped", drain_timeout=0)
    info = client.models()["stories"].info
    assert (info.context_window_configured, info.context_window) == (512, 512)
