"""Registration with the fleet's router (PANTHEON_REGISTRY_URL; docs/fleet.md): what `serve` runs beside its routes
when that setting names a router, and never otherwise.

Every PANTHEON_REGISTRY_HEARTBEAT_S the agent reads the engine's placements and one status round trip of its
workers, and reports each served name (fleet/contract.py's InstanceReport: `instance_id` host:port:name, the endpoint
the router forwards to, capacity, in-flight, free slots, the context window, and an epoch that changes whenever the
instance's caches were emptied). A name it has not reported yet is registered (`POST /registry/register`), one it has
is heartbeated (`POST /registry/heartbeat`); a heartbeat the router answers 404 (it dropped or never had the
instance) registers again, a model loaded since is registered, an unloaded one is no longer reported (the router drops
it after PANTHEON_REGISTRY_TIMEOUT_S). A router that cannot be reached is logged once per outage, and serving goes on.
It runs on serve's event loop (httpx.AsyncClient), started once serve listens and stopped before its workers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass

import httpx
import msgspec
from django.conf import settings

from fleet.contract import InstanceReport
from fleet.prefix_hashes import served_prefixes
from inference.engine.contract import messages as p
from inference.runtime.client_protocol import EngineClient, ModelPlacement

logger = logging.getLogger("pantheon.fleet")

STATUS_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0


@dataclass(slots=True)
class ServedLoad:
    """One served name's load, summed over its placements (in-process replicas share the name)."""

    capacity: int = 0
    in_flight: int = 0
    free_slots: int = 0
    context_window: int | None = None
    epoch_parts: tuple = ()


def served_loads(
    placements: dict[str, ModelPlacement], statuses: list[p.Status], workers: dict
) -> dict[str, ServedLoad]:
    """Each ready served name's capacity (slots), in flight (running + waiting), free slots and context window (the
    smallest of its placements'), from the placements and one status of every worker."""
    live = {(status.device, model.name): model for status in statuses for model in status.models}
    loads: dict[str, ServedLoad] = {}
    for placement in sorted(placements.values(), key=lambda pl: pl.name):
        model = live.get((placement.device, placement.name))
        if placement.state != "ready" or model is None:
            continue
        load = loads.setdefault(placement.served_name, ServedLoad())
        load.capacity += model.max_concurrent
        load.in_flight += model.running + model.waiting
        load.free_slots += max(0, model.max_concurrent - model.running)
        window = model.context_window
        load.context_window = window if load.context_window is None else min(load.context_window, window)
        link = workers.get(placement.device)
        version = placement.info.weights_version if placement.info else 0
        commits = placement.weights.commits if placement.weights else None
        load.epoch_parts += (placement.name, link.identity if link else b"", version, commits)
    return loads


class RegistrationAgent:
    def __init__(self, client: EngineClient, *, registry_url: str, endpoint: str, host: str, port: int) -> None:
        self.client = client
        self.registry_url = registry_url
        self.endpoint = endpoint
        self.address = f"{host}:{port}"
        self.run_token = uuid.uuid4().hex  # this run's: a restarted serve empties its caches
        self.registered: set[str] = set()  # served names the router has accepted
        self._router_away = False
        self._task: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None

    @classmethod
    def from_settings(cls, client: EngineClient, host: str, port: int) -> RegistrationAgent:
        """`host` is what serve listens on; an instance listening on every address advertises loopback unless
        PANTHEON_PUBLIC_URL says where the router reaches it."""
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        endpoint = settings.PANTHEON_PUBLIC_URL or f"http://{shown}:{port}"
        return cls(client, registry_url=settings.PANTHEON_REGISTRY_URL, endpoint=endpoint, host=shown, port=port)

    def start(self) -> None:
        headers = {"Authorization": f"Bearer {settings.PANTHEON_FLEET_TOKEN}"}
        self._http = httpx.AsyncClient(base_url=self.registry_url, headers=headers, timeout=REQUEST_TIMEOUT_S)
        self._task = asyncio.get_event_loop().create_task(self.run(), name="fleet-registration")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    async def run(self) -> None:
        while True:
            try:
                await self.report_once()
            except Exception:
                logger.exception("reporting to the router failed")
            await asyncio.sleep(settings.PANTHEON_REGISTRY_HEARTBEAT_S)

    async def report_once(self) -> None:
        statuses = await self.client.status(timeout=STATUS_TIMEOUT_S)
        loads = served_loads(self.client.models(), statuses, self.client.workers())
        self.registered &= loads.keys()  # unloaded (or reloading): no longer reported, registered afresh if back
        for name, load in loads.items():
            try:
                await self._report(self._instance_report(name, load))
            except httpx.HTTPError as exc:
                self._note_router_away(exc)
                return
        if self._router_away:
            self._router_away = False
            logger.warning("the router at %s is reachable again", self.registry_url)

    def _instance_report(self, name: str, load: ServedLoad) -> InstanceReport:
        epoch = hashlib.blake2b(repr((self.run_token, load.epoch_parts)).encode(), digest_size=8).hexdigest()
        return InstanceReport(
            instance_id=f"{self.address}:{name}", model_id=name, endpoint=self.endpoint,
            node_id=settings.PANTHEON_NODE_ID, transport=settings.PANTHEON_REGISTRY_TRANSPORT,
            capacity=load.capacity, in_flight=load.in_flight, free_slots=load.free_slots,
            context_window=load.context_window, epoch=epoch, cached_prefixes=served_prefixes(name).report(epoch),
        )  # fmt: skip

    async def _report(self, report: InstanceReport) -> None:
        body = msgspec.json.encode(report)
        headers = {"Content-Type": "application/json"}
        if report.model_id in self.registered:
            answer = await self._http.post("/registry/heartbeat", content=body, headers=headers)
            if answer.status_code != 404:
                answer.raise_for_status()
                return
            self.registered.discard(report.model_id)  # the router does not know it (any more): register again
        answer = await self._http.post("/registry/register", content=body, headers=headers)
        answer.raise_for_status()
        self.registered.add(report.model_id)
        logger.info("registered %s with the router at %s", report.instance_id, self.registry_url)

    def _note_router_away(self, exc: Exception) -> None:
        if not self._router_away:
            self._router_away = True
            logger.warning("the router at %s cannot be reached (%s); serving goes on, it is tried again every %s s",
                           self.registry_url, exc, settings.PANTHEON_REGISTRY_HEARTBEAT_S)  # fmt: skip
