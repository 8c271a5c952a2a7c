"""manage.py list_models: the catalogue, and for each model its live instances and their state."""

import msgspec

from inference.engine.contract.params import LoadOptions
from inference.models import CatalogModel, InstanceState
from pantheon_site.management.base import CommandResult, PantheonCommand, format_table


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n else "-"


def _options(options: LoadOptions) -> str:
    """The load options that differ from the defaults, e.g. "ctx_cap=256 quantize=True"; "-" when none does."""
    defaults = msgspec.structs.asdict(LoadOptions())
    changed = [f"{k}={v}" for k, v in msgspec.structs.asdict(options).items() if v != defaults[k]]
    return " ".join(changed) or "-"


def _instances(model: CatalogModel) -> str:
    """e.g. "my-model@cuda:0 ready #3, my-model@cpu failed #4 (out of memory)"."""
    parts = []
    for instance in model.instances.all():
        text = f"{instance.served_name}@{instance.device} {instance.state} #{instance.pk}"
        if instance.state == InstanceState.FAILED and instance.last_error:
            text += f" ({instance.last_error.splitlines()[0][:60]})"
        parts.append(text)
    return ", ".join(parts) or "not loaded"


class Command(PantheonCommand):
    help = "List catalogued models with their format, size and load defaults, and every instance's state."

    def perform(self, **options) -> CommandResult:
        models = CatalogModel.objects.prefetch_related("instances").order_by("name")
        if not models:
            return CommandResult(lines=["The catalogue is empty. Add a model with: manage.py load_model PATH"])
        rows = [
            [
                m.name,
                m.format,
                m.architecture or "-",
                _size(m.size_bytes),
                m.device or "auto",
                _options(m.load_options),
                "yes" if m.autoload else "no",
                _instances(m),
                m.path,
            ]
            for m in models
        ]
        headers = ["NAME", "FORMAT", "ARCH", "SIZE", "DEVICE", "OPTIONS", "AUTOLOAD", "INSTANCES", "PATH"]
        return CommandResult(lines=format_table(headers, rows))
