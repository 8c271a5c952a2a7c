"""An unloaded model is freed by the worker itself: nothing keeps it (its weights and KV pool) alive, and the worker
collects it at once rather than at some later garbage collection, also when the worker froze its heap (a worker
process keeps its long-lived objects, the models among them, out of the collector's reach)."""

import gc
import weakref

import pytest
import zmq

from inference.engine.hosted_model import HostedModel
from inference.engine.worker import Worker
from inference.runtime.in_process_client import InProcessEngineClient
from tests.inference.engine_calls import generate, load


def hosted_models() -> list[HostedModel]:
    return [o for o in gc.get_objects() if type(o) is HostedModel]


@pytest.mark.asyncio
async def test_an_unloaded_model_is_freed_by_the_unload(stories_gguf_path):
    client = InProcessEngineClient()  # the worker loop in a thread of this process, so its objects are visible
    await client.start()
    try:
        others = [weakref.ref(o) for o in hosted_models()]  # models other tests of this process left behind
        await load(client, "stories", str(stories_gguf_path))
        generation = await generate(client, "stories", prompt_token_ids=[1, 300], max_tokens=4)
        [_ async for _ in generation]
        [model] = [weakref.ref(o) for o in hosted_models() if not any(r() is o for r in others)]
        assert model() is not None
        await client.unload("stories")  # no collection here: the worker's own must have freed it
        assert model() is None
    finally:
        await client.close()


def test_a_worker_that_froze_its_heap_still_frees_an_unloaded_model():
    class Model:  # stands for a model's objects: a reference cycle only the cyclic collector frees
        pass

    socket = zmq.Context.instance().socket(zmq.DEALER)
    worker = Worker(socket, "cpu", freeze_heap=True)
    try:
        model = Model()
        model.self = model
        freed = weakref.ref(model)
        worker.freeze()  # as after its load
        del model  # the unload dropped the last reference
        gc.collect()
        assert freed() is not None  # frozen: an ordinary collection leaves it
        worker.free_memory()
        assert freed() is None
    finally:
        gc.unfreeze()
        socket.close()
