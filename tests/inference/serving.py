"""Running Pantheon as a user does, for tests: `manage.py serve` as a subprocess on a free port with real worker
processes, on this test run's database and secret key; and small helpers for talking to it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import httpx
import psutil
import pytest
from django.conf import settings
from django.db import connection

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    """A DATABASE_URL naming the database this test process uses, for subprocesses that must see the same rows."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"


class PantheonServer:
    """One `manage.py serve` subprocess with its own data folder (so its run file is its own); `script`: the
    README's `scripts/serve` instead, as a new user starts it. A subclass names another long-running command
    (`command_name`) and the path that answers 200 once it is up (`ready_path`)."""

    command_name = "serve"
    ready_path = "/"

    def __init__(self, data_dir: Path, env: dict[str, str], *, script: bool = False, port: int | None = None):
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = data_dir / f"{self.command_name}.log"
        self.process: subprocess.Popen | None = None
        self.command = [sys.executable, "manage.py", self.command_name, "--port", str(self.port)]
        if script:
            self.command, self.env = ["bash", "scripts/serve"], {**env, "PORT": str(self.port)}

    def start(self) -> Self:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.command_name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.command_name} did not answer within {START_TIMEOUT_S} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, as a service manager would; returns the exit code (SIGKILL after `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def worker_pids(self) -> list[int]:
        """The pids of this server's worker processes."""
        pids = []
        for child in psutil.Process(self.process.pid).children():
            try:
                if "inference.engine.worker" in " ".join(child.cmdline()):
                    pids.append(child.pid)
            except psutil.Error:  # just killed: a zombie until the supervisor reaps it, no longer a worker
                continue
        return pids

    def manage(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """`manage.py ARGS` with this server's environment (so it finds the server through the run file)."""
        return run_manage(self.env, *args, timeout=timeout)

    def run_file(self) -> dict:
        return json.loads((self.data_dir / "run" / "server.json").read_text())


def serving_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """The environment of a server (or command) on this test run's database and secret key. Its serve starts no
    embedded Celery worker (a test that runs batches or periodic work starts the Celery processes it needs)."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        PANTHEON_DATA_DIR=str(data_dir),
        DJANGO_SECRET_KEY=settings.SECRET_KEY,
        PANTHEON_TOKEN_HMAC_KEY=settings.PANTHEON_TOKEN_HMAC_KEY,
        PANTHEON_WORKER_DEVICES="cpu",
        PANTHEON_WORKER_RESTART_BACKOFF_S="0.2",
        PANTHEON_LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
        PANTHEON_EMBEDDED_CELERY="0",
    )
    env.update(overrides)
    return env


def run_manage(env: dict[str, str], *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """`python manage.py ARGS` in a subprocess with `env`; its output is captured as text."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@contextlib.contextmanager
def operator_client(server: PantheonServer, token: str) -> Iterator[httpx.Client]:
    """An operator's client of `server`; on leaving, unloads whatever is still loaded, so the next test starts
    from an empty server."""
    with httpx.Client(base_url=server.url, timeout=60, headers=bearer(token)) as client:
        yield client
        for row in client.get("/admin/models").json()["data"]:
            client.post("/admin/models/unload", json={"name": row["id"]})


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05):
    """Polls `predicate` until it returns something truthy; returns it, or fails the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout} s")


def sse_events(response: httpx.Response) -> list:
    """The data payloads of an SSE response, JSON-decoded ("[DONE]" kept as the string)."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
