"""The run file: how `manage.py load_model` and `unload_model` find the running server and may act on it.

`serve` writes PANTHEON_RUN_DIR/server.json once it listens: its pid, the URL to reach it on, and a per-run local
admin credential (a random secret that exists only in that file and in the server's memory). The file is created
with mode 0600, so only the user who runs the server (and root) can read the credential; it is removed when the
server stops. A command that finds the file checks that the pid is alive and the server answers before using it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from django.conf import settings


@dataclass(slots=True)
class RunInfo:
    pid: int
    url: str  # e.g. http://127.0.0.1:8000
    admin_secret: str


def run_file_path() -> Path:
    return Path(settings.PANTHEON_RUN_DIR) / "server.json"


def write_run_file(info: RunInfo) -> Path:
    """Writes the run file atomically, readable by the owner only."""
    path = run_file_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(info), f)
    os.replace(draft, path)
    return path


def remove_run_file(pid: int) -> None:
    """Removes the run file if it is still this server's (a newer server may have replaced it)."""
    info = read_run_file()
    if info is not None and info.pid == pid:
        run_file_path().unlink(missing_ok=True)


def read_run_file() -> RunInfo | None:
    """The run file's contents, or None when there is none (or it is unreadable or not ours to read)."""
    try:
        data = json.loads(run_file_path().read_text())
        return RunInfo(int(data["pid"]), str(data["url"]), str(data["admin_secret"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
