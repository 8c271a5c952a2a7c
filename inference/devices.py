"""The devices this host can serve on: `cpu` always, plus `cuda:N` for each GPU torch sees, with their memory.

Used by `manage.py devices`; the supervisor (one worker per device) and /admin/dies can use the same probe.
"""

from dataclasses import dataclass

import psutil


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
