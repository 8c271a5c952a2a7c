"""The catalogue's write path: what a path names, and the one upsert of a catalogue row.

An operator's load (the route, `manage.py load_model` against a running server) and `manage.py load_model` with no
server running both end here, so a model catalogued either way is the same row: its checkpoint, its load options,
where to place it, and `autoload`, so that `serve` loads it at start.
"""

from __future__ import annotations

from typing import Any

import msgspec

from inference.engine.contract.checkpoint import Checkpoint, NotACheckpoint, inspect_checkpoint
from inference.engine.contract.params import LoadOptions
from inference.models import CatalogModel, InstanceState
from pantheon_site.errors import LoadFailed

# How the control plane answers a path that is not a checkpoint (NotACheckpoint.reason -> HTTP status).
NOT_A_CHECKPOINT_STATUS = {"not_found": 404, "not_a_checkpoint": 400, "unreadable": 400}


def checkpoint_at(path: str) -> Checkpoint:
    """The checkpoint at `path`, read before any worker is involved. LoadFailed 404 when nothing is there, 400
    when it is neither a Hugging Face checkpoint directory nor a GGUF file."""
    try:
        return inspect_checkpoint(path)
    except NotACheckpoint as exc:
        raise LoadFailed(str(exc), status=NOT_A_CHECKPOINT_STATUS[exc.reason], reason=exc.reason) from None


def catalogued_options(name: str, named: dict[str, Any]) -> LoadOptions:
    """The options of a load of `name` that names the options `named`: those, and for every option it leaves out
    the catalogue entry's saved value (the struct's default for a name not catalogued). So a load that says less
    never erases what an earlier one chose; naming an option, its default included, replaces it."""
    entry = CatalogModel.objects.filter(name=name).first()
    return msgspec.structs.replace(entry.load_options if entry else LoadOptions(), **named)


def do_catalogue_model(
    name: str, checkpoint: Checkpoint, options: LoadOptions, *, device: str = "", architecture: str = ""
) -> CatalogModel:
    """Makes `name` the catalogue entry for `checkpoint` loaded with `options` on `device` ("": automatic),
    created or replaced, and marked autoload, serving the checkpoint's own weights (no trainer checkpoint in their
    place). `architecture` is the worker's word for it when a load ran (else what the checkpoint says)."""
    architecture_length = CatalogModel._meta.get_field("architecture").max_length
    model, _ = CatalogModel.objects.update_or_create(
        name=name,
        defaults={
            "path": checkpoint.path,
            "format": checkpoint.format,
            "architecture": (architecture or checkpoint.architecture)[:architecture_length],
            "size_bytes": checkpoint.size_bytes,
            "load_options": options,
            "device": device,
            "autoload": True,
            "served_checkpoint": "",
        },
    )
    return model


def do_remove_catalogue_model(name: str) -> CatalogModel:
    """Removes `name` from the catalogue, so `serve` no longer loads it. Refused (LoadFailed 409) while an instance
    of it is served: unload it first. Its failed instance rows, kept only to show the error, go with it."""
    model = CatalogModel.objects.filter(name=name).first()
    if model is None:
        raise LoadFailed(f"no catalogue entry named {name!r}", status=404, reason="not_catalogued")
    if model.instances.exclude(state=InstanceState.FAILED).exists():
        raise LoadFailed(f"{name!r} is loaded; unload it before removing it", status=409, reason="loaded")
    model.instances.all().delete()
    model.delete()
    return model
