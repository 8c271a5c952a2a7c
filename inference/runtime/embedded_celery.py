"""The embedded Celery worker: one `celery worker --beat` child process of `serve`, for a platform with no REDIS_URL.

Without a broker service, batches and the periodic work still need a Celery worker; `serve` starts one on kombu's
filesystem transport (settings.py) once it listens, since a batch's task finds the server through the run file
written then. It is the same worker production runs (`celery -A pantheon_site worker`), so the embedded setup runs
tasks on production's code path, and restarting it loses nothing: a batch's progress lives in the database. It runs
in a session of its own (a Ctrl-C reaches only `serve`), shares `serve`'s environment (settings, database, data
folder) and output, is started again with backoff when it dies, and stopped with SIGTERM, then SIGKILL after a grace,
when `serve` stops. Celery runs the embedded beat as a process of its own, a child of the worker: signals go to the
worker's whole process group, so beat never outlives it (docs/celery.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import time

from inference.runtime.child_processes import restart_delay, signal_group, spawn_child, terminate_group, wait_exit

logger = logging.getLogger("pantheon.celery")


def celery_worker_command(concurrency: int, log_level: str, python: str = sys.executable) -> list[str]:
    """The embedded worker's command line: the production worker's, with beat inside it and nothing that talks to
    other workers (there are none, and on the filesystem transport their broadcasts would stay behind as files)."""
    return [python, "-m", "celery", "-A", "pantheon_site", "--quiet", "--skip-checks",  # serve has checked
            "worker", "--beat", "--hostname", "embedded@%h",
            "--pool", "threads", "--concurrency", str(concurrency),  # tasks wait on HTTP and the database, not CPU
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "--exit-with-parent",  # a serve killed with SIGKILL cannot stop it (pantheon_site/celery_parent.py)
            "--loglevel", log_level]  # fmt: skip


class EmbeddedCeleryWorker:
    """Starts, watches, restarts and stops the one Celery worker child process of `serve`."""

    def __init__(
        self,
        command: list[str],
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        stable_after: float = 60.0,
        stop_grace: float = 10.0,
        poll_interval: float = 0.1,
    ):
        self.command = command
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after  # up this long before it died: restarted without backoff
        self.stop_grace = stop_grace
        self.poll_interval = poll_interval  # only where no pidfd tells of its exit at once
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._keeper: asyncio.Task | None = None
        self._stopping = False

    @classmethod
    def from_settings(cls) -> EmbeddedCeleryWorker:
        """A worker configured by the Django settings (read once, here): the workers' restart backoff applies."""
        from django.conf import settings

        return cls(
            celery_worker_command(settings.PANTHEON_EMBEDDED_CELERY_CONCURRENCY, settings.PANTHEON_LOG_LEVEL),
            backoff_initial=settings.PANTHEON_WORKER_RESTART_BACKOFF_S,
            backoff_max=settings.PANTHEON_WORKER_RESTART_BACKOFF_MAX_S,
        )

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        """Starts the child, and on the event loop (which may not run yet: daphne says it listens just before its
        reactor runs) a task that starts it again whenever it dies."""
        self.process = spawn_child(self.command)
        logger.info("started the embedded Celery worker (pid %s)", self.process.pid)
        self._keeper = asyncio.get_event_loop().create_task(self._keep_running(), name="embedded-celery")

    async def stop(self) -> None:
        """Stops restarting it, then ends it and its beat: SIGTERM (Celery's warm shutdown), SIGKILL after the
        grace."""
        self._stopping = True
        if self._keeper:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        await asyncio.to_thread(self.terminate)

    def terminate(self) -> None:
        """Ends the child now, without restarting it. Safe from any thread; serve's last word on its way out."""
        self._stopping = True
        if self.process is not None:
            terminate_group(self.process, self.stop_grace)

    async def _keep_running(self) -> None:
        failures_in_a_row = 0
        while not self._stopping:
            started_at = time.monotonic()
            returncode = await wait_exit(self.process, self.poll_interval)
            if self._stopping:
                return
            signal_group(self.process, signal.SIGKILL)  # its beat, orphaned: the next worker starts its own
            failures_in_a_row = 0 if time.monotonic() - started_at > self.stable_after else failures_in_a_row + 1
            delay = restart_delay(self.backoff_initial, self.backoff_max, failures_in_a_row)
            logger.error("the embedded Celery worker (pid %s) exited with code %s; starting it again in %g s",
                         self.process.pid, returncode, delay)  # fmt: skip
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.process = spawn_child(self.command)
            self.restarts += 1
            logger.info("started the embedded Celery worker again (pid %s)", self.process.pid)
