"""manage.py devices: the devices workers can run on, with their memory."""

from inference.runtime.host_probe import probe_devices
from pantheon_site.management.base import CommandResult, PantheonCommand, format_table


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


class Command(PantheonCommand):
    help = "List the devices Pantheon can serve on (cpu, cuda:N) with total, used and free memory."

    def perform(self, **options) -> CommandResult:
        rows = [
            [d.name, d.description, gib(d.total_bytes), gib(d.used_bytes), gib(d.free_bytes)] for d in probe_devices()
        ]
        return CommandResult(lines=format_table(["DEVICE", "DESCRIPTION", "TOTAL", "USED", "FREE"], rows))
