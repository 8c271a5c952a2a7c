"""What one router process holds: the registry, the routing policy, and the HTTP client it forwards with.

`manage.py router` builds one `FleetRouter` on its event loop and installs it; the router's views (fleet/views.py)
read it with `installed_router()`. The registry is shared with every other router (fleet/registry.py); the policy and
the client are this process's own.
"""

from __future__ import annotations

import contextlib
import logging

import httpx
from redis.exceptions import RedisError

from fleet.contract import InstanceRecord
from fleet.registry import Registry, registry_from_settings
from fleet.routing import RoutingPolicy
from pantheon_site.errors import ServiceUnavailable

logger = logging.getLogger("pantheon.fleet")

# How long a forward may take to connect to an instance before it counts as unreachable (then it is retried on
# another); reading has no limit, since a generation may be long: a silent instance is caught by the registry
# (fleet/forwarding.py).
CONNECT_TIMEOUT_S = 5.0


class FleetRouter:
    def __init__(self, registry: Registry, policy: RoutingPolicy, client: httpx.AsyncClient) -> None:
        self.registry = registry
        self.policy = policy
        self.client = client
        self.known: set[str] = set()  # instance ids live at the last read, so the policy hears of those gone since

    @classmethod
    def from_settings(cls) -> FleetRouter:
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        return cls(registry_from_settings(), RoutingPolicy(), httpx.AsyncClient(timeout=timeout, limits=limits))

    async def live(self) -> list[InstanceRecord]:
        """Every live instance; the policy is told of each one that was live at the last read and is not now."""
        with registry_errors():
            records = await self.registry.live()
        now = {record.report.instance_id for record in records}
        for instance_id in self.known - now:
            logger.warning("instance %s is gone (no heartbeat within the timeout)", instance_id)
            await self.policy.instance_gone(instance_id)
        self.known = now
        return records

    async def live_for(self, model_id: str) -> list[InstanceRecord]:
        return [record for record in await self.live() if record.report.model_id == model_id]

    async def is_live(self, instance_id: str) -> bool:
        return any(record.report.instance_id == instance_id for record in await self.live())

    async def unreachable(self, instance_id: str) -> None:
        """A forward could not connect to the instance: every router stops choosing it until it heartbeats again."""
        logger.warning("instance %s could not be reached; dropped until it registers again", instance_id)
        with registry_errors():
            await self.registry.drop(instance_id)
        self.known.discard(instance_id)
        await self.policy.instance_gone(instance_id)

    async def close(self) -> None:
        await self.client.aclose()
        await self.registry.close()


@contextlib.contextmanager
def registry_errors():
    """A registry that cannot be reached (Redis down) is 503 service_unavailable, not a server error."""
    try:
        yield
    except (RedisError, OSError) as exc:
        message = f"the fleet's registry cannot be reached ({type(exc).__name__})"
        raise ServiceUnavailable(message, retry_after=1) from None


def model_rows(records: list[InstanceRecord]) -> list[dict]:
    """The router's /v1/models rows (spec: the router's shape): one per model id across its live instances, with
    `live` (how many), `free_slots` (summed) and `context_window` (the minimum: a request may land on any of them;
    left out when any of them has not reported one)."""
    by_model: dict[str, list[InstanceRecord]] = {}
    for record in records:
        by_model.setdefault(record.report.model_id, []).append(record)
    rows = []
    for model_id in sorted(by_model):
        reports = [record.report for record in by_model[model_id]]
        row = {"id": model_id, "object": "model", "created": 0, "owned_by": "pantheon", "live": len(reports),
               "free_slots": sum(report.free_slots for report in reports)}  # fmt: skip
        windows = [report.context_window for report in reports]
        if None not in windows:
            row["context_window"] = min(windows)
        rows.append(row)
    return rows


_installed: FleetRouter | None = None


def install_router(router: FleetRouter | None) -> None:
    global _installed
    _installed = router


def installed_router() -> FleetRouter:
    if _installed is None:
        raise RuntimeError("no fleet router runs in this process (manage.py router installs one)")
    return _installed
