"""The router's registry: which serve instances are live, and what each last reported.

Kept in Redis (PANTHEON_FLEET_REDIS_URL, default REDIS_URL) so that every router process sees the same instances: an
instance registers with, and heartbeats to, whichever router its load balancer picks, and any router forwards to it.
Without Redis it is kept in the router's memory, which is right for one router only. Both forms answer the same
four calls; docs/fleet.md lists the Redis keys.

Liveness is the key's own expiry in Redis (every register or heartbeat rewrites the instance's key with a time to live
of PANTHEON_REGISTRY_TIMEOUT_S), so routers on different hosts never compare clocks; in memory it is the record's
`last_seen`. A heartbeat only refreshes a key that still exists (SET ... XX): an instance that was dropped is told it
is unknown and registers again, so a router never holds a record it did not get whole.
"""

from __future__ import annotations

import time
from typing import Protocol

import msgspec

from fleet.contract import InstanceRecord, InstanceReport

KEY_PREFIX = "pantheon:fleet:"
INSTANCE_KEY = KEY_PREFIX + "instance:"  # + instance id: the InstanceRecord as JSON, expiring after the timeout
INSTANCE_IDS = KEY_PREFIX + "instances"  # a set of the instance ids that may be live (pruned as keys expire)

_decode_record = msgspec.json.Decoder(InstanceRecord).decode


class Registry(Protocol):
    async def register(self, report: InstanceReport) -> None:
        """Records the instance as live now, whether or not it was known."""

    async def heartbeat(self, report: InstanceReport) -> bool:
        """Refreshes a known instance's record; False (nothing recorded) when the registry does not hold it."""

    async def live(self) -> list[InstanceRecord]:
        """Every live instance, in no order."""

    async def drop(self, instance_id: str) -> None:
        """Forgets the instance now (the router could not reach it); a live one registers again on its next
        heartbeat."""

    async def ping(self) -> None:
        """Raises when the registry cannot be reached (the router's readiness)."""

    async def close(self) -> None: ...


class MemoryRegistry:
    """One router's registry, in its memory."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.records: dict[str, InstanceRecord] = {}

    async def register(self, report: InstanceReport) -> None:
        self.records[report.instance_id] = InstanceRecord(report=report, last_seen=time.time())

    async def heartbeat(self, report: InstanceReport) -> bool:
        if report.instance_id not in {r.report.instance_id for r in await self.live()}:
            return False
        await self.register(report)
        return True

    async def live(self) -> list[InstanceRecord]:
        oldest = time.time() - self.timeout_s
        for instance_id in [i for i, r in self.records.items() if r.last_seen < oldest]:
            del self.records[instance_id]
        return list(self.records.values())

    async def drop(self, instance_id: str) -> None:
        self.records.pop(instance_id, None)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisRegistry:
    """The registry every router process shares, in Redis (keys: the module docstring, docs/fleet.md)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        import redis.asyncio as redis

        self.redis = redis.from_url(url)
        self.ttl_ms = max(1, round(timeout_s * 1000))

    def _record(self, report: InstanceReport) -> bytes:
        return msgspec.json.encode(InstanceRecord(report=report, last_seen=time.time()))

    async def register(self, report: InstanceReport) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(INSTANCE_KEY + report.instance_id, self._record(report), px=self.ttl_ms)
            pipe.sadd(INSTANCE_IDS, report.instance_id)
            await pipe.execute()

    async def heartbeat(self, report: InstanceReport) -> bool:
        # The SADD mends the set should another router have pruned the id between its read and this heartbeat.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(INSTANCE_KEY + report.instance_id, self._record(report), px=self.ttl_ms, xx=True)
            pipe.sadd(INSTANCE_IDS, report.instance_id)
            refreshed, _ = await pipe.execute()
        return bool(refreshed)

    async def live(self) -> list[InstanceRecord]:
        ids = sorted(i.decode() for i in await self.redis.smembers(INSTANCE_IDS))
        if not ids:
            return []
        values = await self.redis.mget([INSTANCE_KEY + i for i in ids])
        expired = [i for i, value in zip(ids, values, strict=True) if value is None]
        if expired:
            await self.redis.srem(INSTANCE_IDS, *expired)
        return [_decode_record(value) for value in values if value is not None]

    async def drop(self, instance_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(INSTANCE_KEY + instance_id)
            pipe.srem(INSTANCE_IDS, instance_id)
            await pipe.execute()

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()


def registry_from_settings() -> Registry:
    from django.conf import settings

    timeout_s = settings.PANTHEON_REGISTRY_TIMEOUT_S
    if settings.PANTHEON_FLEET_REDIS_URL:
        return RedisRegistry(settings.PANTHEON_FLEET_REDIS_URL, timeout_s)
    return MemoryRegistry(timeout_s)
