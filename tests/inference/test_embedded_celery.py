"""The embedded Celery worker, as a user gets it from `manage.py serve` with no REDIS_URL: one `celery worker --beat`
child process that consumes what is sent to the filesystem broker under the data folder, is started again when it
is killed (its beat with it: nothing orphaned), and stops when serve stops, or dies. With REDIS_URL serve starts
none: there, operators run the Celery worker and beat themselves."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from tests.inference.serving import PantheonServer, run_manage, serving_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SEND_TASK = "from batches.tasks import run_batch; print(run_batch.delay('batch_that_does_not_exist').id)"


def embedded_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """A server's environment with no REDIS_URL and PANTHEON_EMBEDDED_CELERY at its default (whatever this test run
    has); INFO, so that the worker's line for each task it receives is in the serve log."""
    env = serving_env(data_dir, PANTHEON_LOG_LEVEL="INFO", **overrides)
    for name in ("REDIS_URL", "PANTHEON_EMBEDDED_CELERY"):
        if name not in overrides:
            env.pop(name, None)
    return env


def celery_children(server: PantheonServer) -> list[psutil.Process]:
    """serve's child processes that run a Celery worker (a killed one, not yet reaped, no longer counts)."""
    children = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if "celery" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                children.append(child)
        except psutil.Error:
            continue
    return children


def the_celery_child(server: PantheonServer) -> psutil.Process:
    [child] = wait_for(lambda: celery_children(server), timeout=60)
    return child


def with_its_children(process: psutil.Process) -> list[psutil.Process]:
    """The worker and what it started (the embedded beat runs as a process of its own, a child of the worker)."""
    return [process, *wait_for(lambda: process.children(recursive=True), timeout=60)]


def gone(processes: list[psutil.Process]) -> bool:
    """Every one of `processes` has exited (and is no zombie: someone reaped it)."""
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def kill_survivors(processes: list[psutil.Process]) -> None:
    """What a failed test leaves running is not left to the next."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def send_a_task(env: dict[str, str]) -> str:
    """Sends `batches.run_batch` as any process of the platform does (here a manage.py shell); returns its task id."""
    sent = run_manage(env, "shell", "-c", SEND_TASK)
    assert sent.returncode == 0, sent.stderr
    return sent.stdout.strip().splitlines()[-1]


def consumed(server: PantheonServer, task_id: str) -> bool:
    """The worker's log line for the task, and no message left in the broker's folder."""
    queue = server.data_dir / "celery" / "queue"
    return f"Task batches.run_batch[{task_id}] received" in server.log() and not list(queue.glob("*.msg"))


@pytest.fixture
def embedded_server(serving_db, tmp_path):
    server = PantheonServer(tmp_path, embedded_env(tmp_path)).start()
    yield server
    server.stop()


def test_serve_runs_one_celery_worker_that_consumes_the_filesystem_broker(embedded_server):
    child = the_celery_child(embedded_server)
    assert re.search(r"\bworker\b.*--beat", " ".join(child.cmdline()))
    # its own session: a Ctrl-C in serve's terminal reaches only serve
    assert os.getsid(child.pid) == child.pid != os.getsid(embedded_server.process.pid)
    task_id = send_a_task(embedded_server.env)
    wait_for(lambda: consumed(embedded_server, task_id), timeout=60)
    assert len(celery_children(embedded_server)) == 1


def test_a_killed_celery_worker_is_started_again_and_its_beat_goes_with_it(embedded_server):
    first = the_celery_child(embedded_server)
    killed = with_its_children(first)
    first.send_signal(signal.SIGKILL)
    second = wait_for(lambda: [c for c in celery_children(embedded_server) if c.pid != first.pid], timeout=60)
    try:
        wait_for(lambda: gone(killed), timeout=60)
    finally:
        kill_survivors(killed)
    assert len(second) == 1 and len(celery_children(embedded_server)) == 1
    task_id = send_a_task(embedded_server.env)
    wait_for(lambda: consumed(embedded_server, task_id), timeout=60)
    assert "the embedded Celery worker" in embedded_server.log() and "exited with code -9" in embedded_server.log()


def test_stopping_serve_stops_the_celery_worker_and_its_beat(embedded_server):
    celery = with_its_children(the_celery_child(embedded_server))
    try:
        assert embedded_server.stop() == 0
        wait_for(lambda: gone(celery), timeout=60)
    finally:
        kill_survivors(celery)


def test_a_killed_serve_leaves_no_celery_worker_behind(embedded_server):
    """serve cannot stop its child when it is SIGKILLed: the worker notices its parent is gone and stops."""
    celery = with_its_children(the_celery_child(embedded_server))
    embedded_server.process.kill()
    embedded_server.process.wait()
    try:
        wait_for(lambda: gone(celery), timeout=60)
    finally:
        kill_survivors(celery)


def test_with_redis_serve_starts_no_celery_worker(serving_db, tmp_path):
    server = PantheonServer(tmp_path, embedded_env(tmp_path, REDIS_URL="redis://127.0.0.1:6379/2")).start()
    try:
        # serve starts the worker before it answers its first request (on listening), so none now means none at all
        assert celery_children(server) == []
        assert "embedded Celery worker" not in server.log()
    finally:
        server.stop()
