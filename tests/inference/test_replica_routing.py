"""The router's choice among a model's replicas (docs/replicas.md), on real workers in threads: the least busy ready
replica, ties to the lowest key; a session stays where it began, and moves only when its replica is gone; and
`served_loads`, what the fleet's registration agent reports per served name."""

import pytest
import pytest_asyncio

from inference.engine.contract.params import LoadOptions, ServingLimits
from inference.runtime.in_process_client import InProcessEngineClient
from inference.runtime.registration import served_loads
from inference.runtime.router import ModelRouter

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_CONCURRENT = 3


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def router(stories_gguf_path):
    client = InProcessEngineClient()
    await client.start()
    for key in ("s", "s#2"):  # two replicas of "s" on the one CPU worker, as model_lifecycle.py keys them
        await client.load(key, str(stories_gguf_path), options=LoadOptions(ctx_cap=256),
                          limits=ServingLimits(max_concurrent=MAX_CONCURRENT), served_name="s")  # fmt: skip
    yield ModelRouter(client)
    await client.close()


async def test_requests_go_to_the_least_busy_replica_ties_to_the_lowest_key(router):
    assert router.serving_names() == ["s"] and [pl.name for pl in router.replicas("s")] == ["s", "s#2"]
    held = [router.acquire("s") for _ in range(3)]
    assert [pl.name for pl in held] == ["s", "s#2", "s"]
    router.release(held[0])
    router.release(held[2])
    assert router.in_flight() == {"s#2": 1}
    assert router.choose("s").name == "s"  # s has none in flight now
    router.release(held[1])
    assert router.in_flight() == {} and router.choose("s").name == "s"


async def test_a_session_stays_on_its_replica_until_that_one_is_gone(router, stories_gguf_path):
    busy = router.acquire("s")  # on s: the session's first turn goes to s#2, the least busy
    first = router.acquire("s", "tom")
    assert first.name == "s#2"
    router.release(busy)
    router.release(first)
    for _ in range(2):  # s is as idle as s#2 now, and first in key order: the session still goes to s#2
        turn = router.acquire("s", "tom")
        assert turn.name == "s#2"
        router.release(turn)
    await router.client.unload("s#2")
    assert router.choose("s", "tom").name == "s"  # its replica is gone: the least busy one takes it
    await router.client.load("s#2", str(stories_gguf_path), options=LoadOptions(ctx_cap=256),
                             limits=ServingLimits(max_concurrent=MAX_CONCURRENT), served_name="s")  # fmt: skip
    assert router.choose("s", "tom").name == "s"


async def test_served_loads_sum_capacity_and_take_the_smallest_window(router):
    client = router.client
    loads = served_loads(client.models(), await client.status(), client.workers())
    assert list(loads) == ["s"]  # the two replicas report as one served name
    load = loads["s"]
    assert (load.capacity, load.in_flight, load.free_slots, load.context_window) == (
        2 * MAX_CONCURRENT, 0, 2 * MAX_CONCURRENT, 256
    )  # fmt: skip
