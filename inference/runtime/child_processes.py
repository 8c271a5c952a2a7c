"""What `serve` does alike for every child process it supervises (the workers, the embedded Celery worker).

A child runs from the checkout in a session of its own, so a Ctrl-C in the terminal reaches only `serve`, which then
stops its children in order; the session is also a process group, through which a child's own children (the embedded
Celery worker's beat process) are reached when it ends or dies. A child's exit is noticed as it happens where the OS
gives a process file descriptor to wait on (Linux 5.3+), otherwise by the caller's poll. A child that dies is started
again after an exponential backoff, and stopping is SIGTERM, then SIGKILL for whatever has not exited after a grace.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable

from inference.runtime.host_probe import REPO_ROOT


def spawn_child(command: list[str]) -> subprocess.Popen:
    """Starts `command` from the checkout with this process's environment (and the checkout on PYTHONPATH), in a
    session of its own; its output goes where this process's goes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(command, env=env, cwd=REPO_ROOT, start_new_session=True)


def restart_delay(initial: float, maximum: float, failures_in_a_row: int) -> float:
    """The backoff before a restart: `initial` after one failure (or none), doubling with each failure in a row."""
    return min(maximum, initial * 2 ** max(0, failures_in_a_row - 1))


def watch_exit(process: subprocess.Popen, on_exit: Callable[[], None]) -> int | None:
    """Calls `on_exit` from the running event loop once `process` has exited; returns the pidfd to give to
    `unwatch_exit`, or None where there is no pidfd (not Linux, or a kernel before 5.3): the caller's poll notices."""
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        return None
    asyncio.get_running_loop().add_reader(fd, on_exit)
    return fd


def unwatch_exit(fd: int | None) -> None:
    if fd is not None:
        asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)


async def wait_exit(process: subprocess.Popen, poll_interval: float) -> int:
    """Returns `process`'s exit code once it has exited, without blocking the event loop."""
    exited = asyncio.Event()
    fd = watch_exit(process, exited.set)
    try:
        while process.poll() is None:
            try:
                await asyncio.wait_for(exited.wait(), timeout=None if fd is not None else poll_interval)
            except TimeoutError:
                continue
    finally:
        unwatch_exit(fd)
    return process.returncode


def terminate(processes: Iterable[subprocess.Popen], grace: float) -> None:
    """SIGTERM each process still running, wait up to `grace` seconds in all, SIGKILL the rest. Safe from any thread."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def terminate_group(process: subprocess.Popen, grace: float) -> None:
    """As `terminate`, for `process` and every process of its group (a child `spawn_child` started leads one): what it
    started goes with it. Safe from any thread."""
    signal_group(process, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    signal_group(process, signal.SIGKILL)
    process.wait()


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Sends `signum` to `process`'s group, which outlives it while a process it started runs (its leader's pid is
    not reused meanwhile: a process group's id stays taken until the group is empty)."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:  # the group is empty: all gone
        pass
