"""The worker supervisor: one worker process per device, restarted when it dies, with the models it held.

`WorkerSupervisor.start()` binds the engine client's socket and starts a worker for `cpu` and one per visible CUDA
device (the cpu worker reports how many its torch sees, so this process never imports torch). A worker's exit is
noticed as it happens where the OS gives a process file descriptor to wait on (Linux), otherwise by a watch task
within `poll_interval`; that task also kills a worker whose heartbeats stop for `heartbeat_timeout`, whose exit is
then noticed the same way. Either way the client ends everything in flight on that worker with `WorkerDied`, the
`on_crash` hook runs (the platform writes an audit event there), and the worker is started again after an
exponential backoff and given back its models. A restart that came up counts in pantheon_worker_restarts_total, and
the dead process's gauges leave /metrics (docs/metrics.md). How a child of `serve` is started, watched, backed off
and stopped is child_processes.py's, shared with the embedded Celery worker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from inference.engine.contract.metrics import WORKER_RESTARTS, forget_process
from inference.runtime.child_processes import restart_delay, spawn_child, terminate, unwatch_exit, watch_exit
from inference.runtime.client_protocol import WorkerLink
from inference.runtime.engine_client import ZmqEngineClient
from inference.runtime.generation import EngineError, WorkerDied

logger = logging.getLogger("pantheon.supervisor")


@dataclass(slots=True)
class WorkerCrash:
    """What the `on_crash` hook is told about a worker that died."""

    device: str
    pid: int
    returncode: int | None  # negative: killed by that signal
    reason: str
    models: list[str]  # the models it held, which the supervisor reloads on the new worker
    restarts: int  # how many times this device's worker was restarted before this crash


@dataclass(slots=True)
class WorkerProcess:
    device: str
    process: subprocess.Popen
    incarnation: int
    started_at: float = field(default_factory=time.monotonic)
    state: str = "starting"  # starting, ready, restarting, stopped
    restarts: int = 0
    failures_in_a_row: int = 0
    exit_fd: int | None = None  # readable once the process has exited (a pidfd), watched by the event loop


@dataclass(slots=True)
class WorkerInfo:
    """One worker as the platform shows it (the workers table, /admin/dies)."""

    device: str
    pid: int
    state: str  # starting, ready, restarting, stopped
    restarts: int
    last_heartbeat: float | None  # time.time() of its last message, None before its first


CrashHook = Callable[[WorkerCrash], Awaitable[None] | None]


class WorkerSupervisor:
    """Starts, watches, restarts and stops the worker processes that serve `client`."""

    def __init__(
        self,
        client: ZmqEngineClient | None = None,
        *,
        devices: list[str] | None = None,
        on_crash: CrashHook | None = None,
        heartbeat_interval: float = 0.5,
        heartbeat_timeout: float = 10.0,
        ready_timeout: float = 120.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 60.0,
        poll_interval: float = 0.1,
        python: str = sys.executable,
        log_format: str = "plain",
        log_level: str = "INFO",
    ):
        self.client = client or ZmqEngineClient()
        self.devices = devices  # None: cpu plus every CUDA device the cpu worker sees
        self.on_crash = on_crash
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.ready_timeout = ready_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after  # a worker up this long before it dies restarts without backoff
        self.poll_interval = poll_interval
        self.python = python
        self.log_format = log_format  # the workers log as the control plane does (inference/engine/contract/logs.py)
        self.log_level = log_level
        self.workers: dict[str, WorkerProcess] = {}
        self._incarnations = 0
        self._watch: asyncio.Task | None = None
        self._recoveries: set[asyncio.Task] = set()

    @classmethod
    def from_settings(cls, on_crash: CrashHook | None = None) -> WorkerSupervisor:
        """A supervisor configured by the PANTHEON_WORKER_* Django settings (read once, here)."""
        from django.conf import settings

        return cls(
            devices=settings.PANTHEON_WORKER_DEVICES or None,
            on_crash=on_crash,
            heartbeat_interval=settings.PANTHEON_WORKER_HEARTBEAT_INTERVAL_S,
            heartbeat_timeout=settings.PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S,
            ready_timeout=settings.PANTHEON_WORKER_START_TIMEOUT_S,
            backoff_initial=settings.PANTHEON_WORKER_RESTART_BACKOFF_S,
            backoff_max=settings.PANTHEON_WORKER_RESTART_BACKOFF_MAX_S,
            log_format=settings.PANTHEON_LOG_FORMAT,
            log_level=settings.PANTHEON_LOG_LEVEL,
        )

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts the workers and returns once each has said READY; raises RuntimeError if one cannot start."""
        await self.client.start()
        devices = self.devices
        if devices is None:
            cpu = await self._start_worker("cpu")
            devices = [f"cuda:{i}" for i in range(cpu.cuda_devices)]
        await asyncio.gather(*(self._start_worker(d) for d in devices if d not in self.workers))
        self._watch = asyncio.create_task(self._watch_workers(), name="worker-supervisor-watch")

    async def stop(self, timeout: float = 10.0) -> None:
        """Stops watching, ends the workers (SIGTERM, then SIGKILL after `timeout`) and closes the client."""
        for task in [self._watch, *self._recoveries]:
            if task:
                task.cancel()
        await asyncio.gather(*(t for t in [self._watch, *self._recoveries] if t), return_exceptions=True)
        await asyncio.to_thread(self.terminate_all, timeout)
        for worker in self.workers.values():
            self._unwatch_exit(worker)
        await self.client.close()

    def terminate_all(self, timeout: float = 10.0) -> None:
        """SIGTERM every worker, wait up to `timeout` seconds in all, SIGKILL the rest. Safe from any thread."""
        for worker in self.workers.values():
            worker.state = "stopped"
        terminate([worker.process for worker in self.workers.values()], timeout)

    # -- what runs where -----------------------------------------------------------------------------------------

    def describe(self) -> list[WorkerInfo]:
        links = self.client.workers()
        return [
            WorkerInfo(w.device, w.process.pid, w.state, w.restarts,
                       links[w.device].last_seen_wall if w.device in links else None)
            for w in self.workers.values()
        ]  # fmt: skip

    def placements(self) -> dict[str, str]:
        """Model name -> the device of the worker that holds it (or is loading or reloading it)."""
        return {name: placement.device for name, placement in self.client.models().items()}

    # -- starting and watching -----------------------------------------------------------------------------------

    def _spawn(self, device: str) -> subprocess.Popen:
        self._incarnations += 1
        command = [self.python, "-m", "inference.engine.worker_process", "--endpoint", self.client.endpoint,
                   "--device", device, "--identity", f"{device}/{self._incarnations}",
                   "--heartbeat-interval", str(self.heartbeat_interval),
                   "--log-format", self.log_format, "--log-level", self.log_level]  # fmt: skip
        return spawn_child(command)

    async def _start_worker(self, device: str, previous: WorkerProcess | None = None) -> WorkerLink:
        process = self._spawn(device)
        worker = WorkerProcess(device, process, self._incarnations)
        if previous:
            worker.restarts, worker.failures_in_a_row = previous.restarts + 1, previous.failures_in_a_row
        self.workers[device] = worker
        if previous:
            self._unwatch_exit(previous)
        self._watch_exit(worker)
        ready = asyncio.ensure_future(self.client.wait_for_worker(device))
        deadline = time.monotonic() + self.ready_timeout
        try:
            while not ready.done():
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise RuntimeError(f"the worker for {device} did not start (exit code {process.poll()})")
                await asyncio.wait([ready], timeout=self.poll_interval)
        finally:
            ready.cancel()
        worker.state = "ready"
        restarts = WORKER_RESTARTS.labels(device)  # exported (at 0) from the first start, so rate() sees the first
        if previous:
            restarts.inc()
        return ready.result()

    async def _watch_workers(self) -> None:
        last_tick = time.monotonic()
        while True:
            await asyncio.sleep(self.poll_interval)
            now = time.monotonic()
            # If this loop itself was stalled, heartbeats may be waiting unread in the socket: judge them next tick.
            judge_heartbeats = now - last_tick < self.heartbeat_timeout / 2
            last_tick = now
            try:
                self._check_workers(judge_heartbeats)
            except Exception:  # the watch must outlive any one bad check
                logger.exception("checking the workers failed")

    def _watch_exit(self, worker: WorkerProcess) -> None:
        """Checks the workers the moment this one exits, so what it ran ends at once rather than at the next poll."""
        worker.exit_fd = watch_exit(worker.process, lambda: self._exited(worker))

    def _exited(self, worker: WorkerProcess) -> None:
        self._unwatch_exit(worker)
        try:
            self._check_workers(judge_heartbeats=False)
        except Exception:  # as in the watch: a bad check must not stop the next
            logger.exception("checking the workers failed")

    @staticmethod
    def _unwatch_exit(worker: WorkerProcess) -> None:
        unwatch_exit(worker.exit_fd)
        worker.exit_fd = None

    def _check_workers(self, judge_heartbeats: bool) -> None:
        links = self.client.workers()
        for device, worker in list(self.workers.items()):
            if worker.state != "ready":
                continue
            returncode = worker.process.poll()
            link = links.get(device)
            silent = link is not None and time.monotonic() - link.last_seen > self.heartbeat_timeout
            if returncode is None and judge_heartbeats and silent:
                logger.error("worker %s (pid %s) missed its heartbeats; killing it", device, worker.process.pid)
                worker.process.kill()
                returncode = worker.process.wait()
                self._begin_recovery(worker, f"sent no heartbeat for {self.heartbeat_timeout:g} s (killed)")
            elif returncode is not None:
                self._begin_recovery(worker, f"exited with code {returncode}")

    def _begin_recovery(self, worker: WorkerProcess, reason: str) -> None:
        worker.state = "restarting"
        forget_process(worker.process.pid)  # its gauges (queues, KV blocks, sessions) went with it
        lost = self.client.worker_lost(worker.device, reason)
        logger.error("worker %s (pid %s) %s; it held %s", worker.device, worker.process.pid, reason,
                     [pl.name for pl in lost] or "no models")  # fmt: skip
        crash = WorkerCrash(worker.device, worker.process.pid, worker.process.returncode, reason,
                            [pl.name for pl in lost], worker.restarts)  # fmt: skip
        task = asyncio.create_task(self._recover(worker, crash), name=f"recover-{worker.device}")
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def _recover(self, worker: WorkerProcess, crash: WorkerCrash) -> None:
        await self._notify(crash)
        uptime = time.monotonic() - worker.started_at
        worker.failures_in_a_row = 0 if uptime > self.stable_after else worker.failures_in_a_row + 1
        while True:
            await asyncio.sleep(restart_delay(self.backoff_initial, self.backoff_max, worker.failures_in_a_row))
            try:
                await self._start_worker(worker.device, previous=worker)
                break
            except RuntimeError:
                logger.exception("restarting the worker for %s failed", worker.device)
                worker.failures_in_a_row += 1
        for name in crash.models:
            if self.client.models().get(name) is None:  # unloaded meanwhile
                continue
            try:
                await self.client.reload(name)
                logger.info("reloaded %s on %s", name, worker.device)
            except WorkerDied:
                return  # died again: the watch starts the next recovery, which reloads what is still to reload
            except (EngineError, TimeoutError):
                logger.exception("reloading %s on %s failed; it is no longer served", name, worker.device)

    async def _notify(self, crash: WorkerCrash) -> None:
        if self.on_crash is None:
            return
        try:
            result = self.on_crash(crash)
            if inspect.isawaitable(result):
                await result
        except Exception:  # the hook is the platform's; its failure must not stop the restart
            logger.exception("the worker crash hook failed")
