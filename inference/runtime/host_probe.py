"""What this host and server are: the devices it can serve on (`manage.py devices`), and for GET / and GET /v1/models
its backend, its build, and how many dies (CUDA devices) the workers see.

The control plane never imports torch: the workers report how many CUDA devices their torch sees (READY), and the
backend is `cuda` when that is more than zero, else `cpu`. The build is the checkout's git commit (`-dirty` when
the tree has changes), else the installed package's version; it is computed once per process.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import psutil

from inference.runtime.client_protocol import EngineClient

REPO_ROOT = Path(__file__).resolve().parents[2]


def dies_visible(client: EngineClient | None) -> int:
    """CUDA devices the workers see (0 on a CPU-only host, or before any worker has started)."""
    if client is None:
        return 0
    return max((link.cuda_devices for link in client.workers().values()), default=0)


def backend(client: EngineClient | None) -> str:
    return "cuda" if dies_visible(client) > 0 else "cpu"


@functools.cache
def build_id() -> str:
    """The git commit this checkout runs (12 hex digits, `-dirty` with local changes), else the package version."""
    try:
        commit = _git("rev-parse", "--short=12", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return f"{commit}-dirty" if dirty else commit
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return metadata.version("pantheon")
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=True)
    return result.stdout.strip()


@dataclass(slots=True)
class DeviceInfo:
    """One device: its torch name, what it is, and its memory in bytes (used = total - free, as the driver says)."""

    name: str
    description: str
    total_bytes: int
    free_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.free_bytes


def probe_devices() -> list[DeviceInfo]:
    """cpu first, then cuda:0..N-1. Importing torch and touching each GPU makes this take a second or more."""
    import torch

    memory = psutil.virtual_memory()
    devices = [DeviceInfo("cpu", f"host CPU ({psutil.cpu_count()} logical cores)", memory.total, memory.available)]
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        devices.append(DeviceInfo(f"cuda:{index}", torch.cuda.get_device_name(index), total, free))
    return devices
