"""The registry's two forms agree (fleet/registry.py): in one router's memory, and in Redis where several routers
share it (this suite's Redis database, tests/fleet/fleet_processes.py). And the router's /v1/models rows from what
it holds: live counts, free slots summed, the smallest context window, none when any instance has not reported one."""

from __future__ import annotations

import asyncio

import pytest

from fleet.contract import InstanceRecord, InstanceReport
from fleet.registry import MemoryRegistry, RedisRegistry
from fleet.router import model_rows
from tests.fleet.fleet_processes import FLEET_REDIS_URL, clear_registry

TIMEOUT_S = 0.5


def report(instance_id: str, model: str = "m", **fields) -> InstanceReport:
    return InstanceReport(instance_id=instance_id, model_id=model, endpoint=f"http://{instance_id}", **fields)


@pytest.fixture(params=["memory", "redis"])
async def registry(request):
    if request.param == "memory":
        yield MemoryRegistry(TIMEOUT_S)
        return
    clear_registry(FLEET_REDIS_URL)
    store = RedisRegistry(FLEET_REDIS_URL, TIMEOUT_S)
    yield store
    await store.close()
    clear_registry(FLEET_REDIS_URL)


async def live_ids(registry) -> set[str]:
    return {record.report.instance_id for record in await registry.live()}


async def test_register_heartbeat_drop_and_expiry(registry):
    assert not await registry.heartbeat(report("a:1:m"))  # unknown: the instance must register
    assert await live_ids(registry) == set()
    await registry.register(report("a:1:m"))
    await registry.register(report("b:2:m", in_flight=3))
    assert await registry.heartbeat(report("b:2:m", in_flight=1))
    records = {record.report.instance_id: record for record in await registry.live()}
    assert set(records) == {"a:1:m", "b:2:m"} and records["b:2:m"].report.in_flight == 1

    await registry.drop("a:1:m")
    assert await live_ids(registry) == {"b:2:m"}
    assert not await registry.heartbeat(report("a:1:m"))

    while await live_ids(registry):  # b stops heartbeating: gone once the timeout has passed
        await asyncio.sleep(TIMEOUT_S / 5)
    assert not await registry.heartbeat(report("b:2:m"))


def record(instance_id: str, model: str, **fields) -> InstanceRecord:
    return InstanceRecord(report=report(instance_id, model, **fields), last_seen=0.0)


def test_the_routers_model_rows():
    rows = model_rows([
        record("a:1:m", "m", free_slots=3, context_window=4096),
        record("b:2:m", "m", free_slots=5, context_window=2048),
        record("a:1:n", "n", free_slots=1, context_window=8192),
        record("b:2:n", "n", free_slots=2, context_window=None),
    ])  # fmt: skip
    assert rows == [
        {"id": "m", "object": "model", "created": 0, "owned_by": "pantheon", "live": 2, "free_slots": 8,
         "context_window": 2048},
        {"id": "n", "object": "model", "created": 0, "owned_by": "pantheon", "live": 2, "free_slots": 3},
    ]  # fmt: skip
