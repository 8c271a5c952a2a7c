"""`celery worker --exit-with-parent`: the worker stops once the process that started it is gone.

`serve` starts its embedded Celery worker with this option. A `serve` that stops stops its child itself, but one
killed with SIGKILL (or by the OOM killer) cannot, and its worker would run on beside the next `serve`'s, a second
consumer of the same broker folder. A process whose parent dies is adopted by another, so a thread of the worker
compares its parent's pid with the one it started with, once a second; when they differ the worker stops as `serve`
would stop it: SIGTERM (Celery's warm shutdown), then SIGKILL to its whole process group (its beat) after a grace,
since a running batch's task would otherwise wait for a server that is not coming back.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import click
from celery import Celery, bootsteps

PARENT_POLL_S = 1.0
STOP_GRACE_S = 10.0


class ExitWithParent(bootsteps.StartStopStep):
    """A worker bootstep, enabled by --exit-with-parent."""

    label = "exit with parent"

    def __init__(self, worker, exit_with_parent: bool = False, **options):
        self.enabled = exit_with_parent
        self.parent_pid = os.getppid()
        self._stopped = threading.Event()

    def start(self, worker) -> None:
        threading.Thread(target=self._watch, name="exit-with-parent", daemon=True).start()

    def stop(self, worker) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(PARENT_POLL_S):
            if os.getppid() != self.parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(STOP_GRACE_S)  # a daemon thread: gone with the process if it exits first
                if os.getpgid(0) == os.getpid():  # it leads its group, as serve starts it: its beat goes too
                    os.killpg(0, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
                return


def install(app: Celery) -> None:
    app.user_options["worker"].add(
        click.Option(["--exit-with-parent"], is_flag=True, default=False,
                     help="Stop once the process that started the worker is gone (serve's embedded worker).")
    )  # fmt: skip
    app.steps["worker"].add(ExitWithParent)
