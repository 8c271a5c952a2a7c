"""The serving side of `manage.py serve`: the worker supervisor, the router, and their mirror in the database.

`start()` forgets the instances of a previous run (they died with it), starts one worker per device and installs
the engine client and the router the routes use; `autoload()` loads the catalogue's autoload models (through the
`load_catalogued` its maker gives it: the services' load, which the runtime beneath them does not import);
`stop()` ends the workers and records that nothing is served any more. Meanwhile a sync task keeps the Worker and
ModelInstance rows in step with the supervisor (pid, state, restarts, heartbeats; instances reloading after a
crash) and refreshes the catalogue names the router routes on, and another samples the metrics into the dashboard's
history (metrics_history.py). A worker crash is audited.

While the database cannot be reached the mirror says so once, keeps serving from memory, and writes what changed
meanwhile when it returns: it remembers a state as written only once the write went through, and an instance whose
unload could not delete its row (the database went away in between) has its row deleted then.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from inference.models import CatalogModel, InstanceState, ModelInstance, Worker, WorkerState
from inference.runtime.client_protocol import install_client
from inference.runtime.metrics_history import MetricsHistory, install_history
from inference.runtime.router import ModelRouter, install_router
from inference.runtime.supervisor import WorkerCrash, WorkerSupervisor
from pantheon_site.audit import arecord_audit_event
from pantheon_site.errors import PantheonError, database_unavailable
from pantheon_site.metrics import collect_families
from pantheon_site.models import Outcome

logger = logging.getLogger("pantheon.serve")

SYNC_INTERVAL_S = 1.0
CATALOG_REFRESH_S = 5.0
DRAIN_POLL_S = 0.05
DRAIN_FLUSH_S = 0.2  # after the last completion ended, time for its final bytes to reach the client
# A worker's row is rewritten at least this often while serve runs (its last_heartbeat refreshed then, not on every
# heartbeat): its updated_at is how the periodic stale-worker check (inference/services/stale_workers.py) knows a
# running serve still vouches for it, even while the worker itself is silent.
HEARTBEAT_RECORD_S = 10.0
WORKER_STATES = {"starting": WorkerState.STARTING, "ready": WorkerState.READY, "restarting": WorkerState.DEAD,
                 "stopped": WorkerState.STOPPED}  # fmt: skip
INSTANCE_STATES = {"ready": InstanceState.READY, "reloading": InstanceState.LOADING,
                   "loading": InstanceState.LOADING, "unloading": InstanceState.UNLOADING}  # fmt: skip


@dataclass(slots=True)
class WorkerRecord:
    pid: int | None
    state: str
    restarts: int
    heartbeat: float  # wall time of the last heartbeat written
    written: float  # time.monotonic() of the sync that wrote the row


# Loads a catalogued model into the router's engine as the system's own audited load; `trigger` says why
# ("autoload", "on_demand"). The services' load_catalogued is the one `serve` gives.
CatalogueLoad = Callable[[ModelRouter, str, str], Awaitable[object]]


class ControlPlane:
    def __init__(self, load_catalogued: CatalogueLoad, *, server: str = "") -> None:
        """`server` names this serve in the rows it writes (its host:port): several serve processes may share one
        database, and each forgets and rewrites only its own."""
        self.load_catalogued = load_catalogued
        self.server = server
        self.supervisor = WorkerSupervisor.from_settings(on_crash=self._on_crash)
        self.client = self.supervisor.client
        self.router = ModelRouter(self.client, load_catalogued=self.load_on_demand, server=server)
        self.history = MetricsHistory(settings.PANTHEON_METRICS_HISTORY_INTERVAL_S, collect_families)
        self._sync_task: asyncio.Task | None = None
        self._history_task: asyncio.Task | None = None
        self._autoload_task: asyncio.Task | None = None
        self._workers: dict[str, WorkerRecord] = {}
        self._instances: dict[int, str] = {}  # instance id -> its placement's state at the last sync
        self._stopping = False  # once set, nothing more is mirrored: stop() writes the final state itself
        self._database_away = False  # the last sync could not reach the database (said once in the log)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        await sync_to_async(_forget_previous_run)(self.server)
        await self.supervisor.start()
        install_client(self.client)
        install_router(self.router)
        install_history(self.history)
        await self._sync_workers()
        await self._refresh_catalog()
        self._sync_task = asyncio.create_task(self._sync_forever(), name="control-plane-sync")
        self._history_task = asyncio.create_task(self.history.run(), name="metrics-history")

    def start_autoload(self) -> None:
        """Loads the catalogue's autoload models in the background (the server answers meanwhile)."""
        self._autoload_task = asyncio.get_event_loop().create_task(self.autoload(), name="autoload")

    async def drain(self, timeout: float) -> None:
        """Refuses new completions (503 server_shutting_down) and returns once none is in flight, or after
        `timeout` seconds; what still runs then is cancelled when the server stops."""
        self.router.shutting_down = True
        deadline = time.monotonic() + timeout
        while self.router.completions_in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        await asyncio.sleep(DRAIN_FLUSH_S)

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in (self._autoload_task, self._sync_task, self._history_task) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        install_history(None)
        install_router(None)
        install_client(None)
        await self.supervisor.stop()
        await sync_to_async(_forget_previous_run)(self.server)

    async def autoload(self) -> None:
        """Loads every catalogue model marked autoload, one after another; a failure is recorded and skipped."""
        names = await sync_to_async(list)(CatalogModel.objects.filter(autoload=True).values_list("name", flat=True))
        for name in names:
            try:
                await self.load_catalogued(self.router, name, "autoload")
            except PantheonError as error:
                logger.error("autoload of %s failed: %s", name, error.message)
                await sync_to_async(_record_failed_instance)(name, error.message, self.server)

    async def load_on_demand(self, name: str) -> None:
        """The router's loader for a /v1 request naming a catalogued model that is not loaded."""
        await self.load_catalogued(self.router, name, "on_demand")

    # -- crashes and the database mirror --------------------------------------------------------------------------

    async def _on_crash(self, crash: WorkerCrash) -> None:
        try:
            await sync_to_async(close_old_connections)()  # not one the database dropped since it was last used
            await self._audit_crash(crash)
            await self._sync_workers()
            await self._sync_instances()  # now, while they are reloading: a reload may fail before the next sync
        except Exception as exc:
            if database_unavailable(exc) is None:
                raise
            # The restart goes on; the rows catch up when the database returns. The audit event is lost.
            self._note_database_away(exc, f"the crash of the worker for {crash.device} is not audited")

    async def _audit_crash(self, crash: WorkerCrash) -> None:
        await arecord_audit_event(
            "worker_crash",
            Outcome.REFUSED,
            actor_kind="system",
            actor_label="supervisor",
            error_type="server_error",
            reason=crash.reason,
            model=", ".join(crash.models),
            details={
                "device": crash.device,
                "pid": crash.pid,
                "returncode": crash.returncode,
                "models": crash.models,
                "restarts": crash.restarts,
            },  # fmt: skip
        )

    async def _sync_forever(self) -> None:
        last_catalog = time.monotonic()
        while True:
            await asyncio.sleep(SYNC_INTERVAL_S)
            try:
                await self._sync_workers()
                await self._sync_instances()
                if time.monotonic() - last_catalog >= CATALOG_REFRESH_S:
                    last_catalog = time.monotonic()
                    await self._refresh_catalog()
            except Exception as exc:  # the database being away for a while must not stop serving
                if database_unavailable(exc) is None:
                    logger.exception("syncing the serving state to the database failed")
                else:
                    self._note_database_away(exc, "the serving state is written when it returns")
                continue
            if self._database_away:
                self._database_away = False
                logger.warning("the database is reachable again; the serving state is written")

    def _note_database_away(self, exc: Exception, consequence: str) -> None:
        """One log line when the database is found away (not one per sync), without a traceback."""
        if not self._database_away:
            self._database_away = True
            first_line = (str(exc.__cause__ or exc).strip().splitlines() or ["no message"])[0]
            logger.warning("the database is unavailable (%s); %s", first_line, consequence)

    async def _sync_workers(self) -> None:
        if self._stopping:
            return
        links = self.client.workers()
        changes = {}
        now = time.monotonic()
        for device, worker in self.supervisor.workers.items():
            link = links.get(device)
            heartbeat = link.last_seen_wall if link else 0.0
            record = WorkerRecord(worker.process.pid, WORKER_STATES.get(worker.state, WorkerState.DEAD),
                                  worker.restarts, heartbeat, now)  # fmt: skip
            last = self._workers.get(device)
            if last and (last.pid, last.state, last.restarts) == (record.pid, record.state, record.restarts):
                if now - last.written < HEARTBEAT_RECORD_S:  # rewritten even when the heartbeat is stuck
                    continue
            changes[device] = record
        if changes:
            await sync_to_async(_write_workers)(changes, self.client.endpoint, self.server)
            self._workers.update(changes)

    async def _sync_instances(self) -> None:
        """Mirrors the state of every placement with an instance row into that row. A placement that is gone was
        unloaded (the unload deletes its row), unless it was reloading: then the reload failed, and its row says so."""
        if self._stopping:
            return
        held = {pl.instance_id: pl.state for pl in self.router.placements().values() if pl.instance_id is not None}
        changes: dict[int, tuple[str, str] | None] = {}  # None: the instance was unloaded, its row goes
        for instance_id, last in self._instances.items():
            if instance_id not in held:
                failed = (InstanceState.FAILED, "the reload after a worker crash failed")
                changes[instance_id] = failed if last == "reloading" else None
        for instance_id, state in held.items():
            last = self._instances.get(instance_id, "ready")  # the load wrote its row as READY
            if INSTANCE_STATES[state] != INSTANCE_STATES[last]:
                changes[instance_id] = (INSTANCE_STATES[state], "")
        if changes:
            await sync_to_async(_write_instances)(changes)
        self._instances = held  # only once written: a sync the database refused is made again by the next

    async def _refresh_catalog(self) -> None:
        names = await sync_to_async(_catalog_names)()
        self.router.catalog_names = frozenset(names)


def _forget_previous_run(server: str) -> None:
    """Instances live in workers this process starts, so rows an earlier run of this serve wrote describe nothing.
    Another serve's rows (another host:port sharing the database) are its own; rows written before serves were named
    ("") are an earlier run's too."""
    mine = {server, ""}
    with transaction.atomic():
        ModelInstance.objects.filter(server__in=mine).delete()
        Worker.objects.filter(server__in=mine).exclude(state=WorkerState.STOPPED).update(
            state=WorkerState.STOPPED, pid=None
        )
    close_old_connections()


def _write_workers(changes: dict[str, WorkerRecord], endpoint: str, server: str) -> None:
    now = timezone.now()
    close_old_connections()  # this thread's connection may predate a database restart: start afresh
    try:
        for device, record in changes.items():
            defaults = {"pid": record.pid, "state": record.state, "restarts": record.restarts, "endpoint": endpoint}
            if record.heartbeat:
                defaults["last_heartbeat"] = datetime.fromtimestamp(record.heartbeat, tz=UTC)
            worker, created = Worker.objects.update_or_create(server=server, device=device, defaults=defaults)
            if created or worker.started_at is None or record.state == WorkerState.STARTING:
                Worker.objects.filter(pk=worker.pk).update(started_at=now)
    finally:
        close_old_connections()


def _write_instances(changes: dict[int, tuple[str, str] | None]) -> None:
    """Each instance's new state, or None: unloaded, so its row is deleted (the unload deleted it already, unless
    the database was away then)."""
    close_old_connections()
    try:
        for instance_id, change in changes.items():
            if change is None:
                ModelInstance.objects.filter(pk=instance_id).delete()
                continue
            state, error = change
            fields = {"state": state}
            if error:
                fields["last_error"] = error
            ModelInstance.objects.filter(pk=instance_id).update(**fields)
    finally:
        close_old_connections()  # also a connection the database dropped, so the next sync connects afresh


def _record_failed_instance(name: str, message: str, server: str) -> None:
    """A catalogued model that could not be loaded at start: a failed instance row says why (list_models shows it)."""
    model = CatalogModel.objects.filter(name=name).first()
    if model is not None:
        ModelInstance.objects.create(catalog=model, served_name=name, server=server, device=model.device or "cpu",
                                     state=InstanceState.FAILED, last_error=message[:2000])  # fmt: skip
    close_old_connections()


def _catalog_names() -> list[str]:
    close_old_connections()
    try:
        return list(CatalogModel.objects.values_list("name", flat=True))
    finally:
        close_old_connections()
