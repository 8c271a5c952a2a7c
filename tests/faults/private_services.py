"""PostgreSQL and Redis of one's own, for fault tests and bench/faults.py: a cluster or server in a folder of its own
on a free port, which the caller may stop and start at will. The shared services on 5432 and 6379 are never
touched (other people's tests run on them).

PostgreSQL refuses to run as root, so as root its commands run as the `postgres` user (runuser), which owns the
folder."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.inference.serving import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed")
    return found[-1]


class PrivatePostgres:
    """One PostgreSQL cluster in a new folder under /tmp (initdb'd on first start; the `postgres` user must reach it,
    which a pytest tmp_path, private to root, is not), trusting local connections, on its own port."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="pantheon-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/pantheon"
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self._as_postgres, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> PrivatePostgres:
        if not self.data.exists():
            if self._as_postgres:
                user = pwd.getpwnam("postgres")
                os.chown(self.root, user.pw_uid, user.pw_gid)
            self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
            self._pg_ctl_start()
            self._run(_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "pantheon")
            return self
        self._pg_ctl_start()
        return self

    def _pg_ctl_start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """`immediate`: as a crash would (no shutdown checkpoint, every connection cut at once)."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        """Stops the cluster if it runs and deletes its folder."""
        if self.running():
            self.stop("fast")
        shutil.rmtree(self.root, ignore_errors=True)

    def running(self) -> bool:
        command = [*self._as_postgres, _pg_bin("pg_ctl"), "-D", str(self.data), "status"]
        return subprocess.run(command, capture_output=True).returncode == 0


class PrivateRedis:
    """One redis-server without persistence in `root`, on its own port."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> PrivateRedis:
        self.root.mkdir(parents=True, exist_ok=True)
        command = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly",
                   "no", "--dir", str(self.root)]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ping = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                return self
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer")

    def stop(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def sign_in(base_url: str, username: str, password: str) -> httpx.Client:
    """A browser-like client of the UI signed in as `username` (the sign-in form, with its CSRF token)."""
    client = httpx.Client(base_url=base_url, timeout=60)
    page = client.get("/ui/login/")
    token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    signed = client.post("/ui/login/", data={"username": username, "password": password,
                                              "csrfmiddlewaretoken": token})  # fmt: skip
    if signed.status_code != 302:
        raise RuntimeError(f"signing in failed: {signed.status_code}")
    return client
