"""manage.py load_model PATH: load a model into the running server, or, with none running, add it to the catalogue
so that `serve` loads it at start. A Hugging Face checkpoint directory or a GGUF file.

Against a running server the command calls POST /admin/models/load with the run's local credential, drawing the
load's progress on stderr meanwhile; the server audits that call (as this OS user), so the command writes no audit
event of its own. Without a server the command
records the catalogue change (the same upsert the load route makes) and audits it.

The option flags (--ctx-cap, ..., --dtype) are LoadOptions' fields, read from the struct with their descriptions;
the body they make is validated by the load route's own validator (inference/services/load_body.py).
"""

import argparse
import sys

import msgspec
from django.conf import settings

from inference.engine.contract.params import LoadOptions
from inference.management.load_progress_bar import LoadProgressBar
from inference.management.server_client import call_admin, running_server
from inference.models import CatalogModel
from inference.services.catalogue import catalogued_options, checkpoint_at, do_catalogue_model
from inference.services.load_body import validate_load_body
from inference.services.model_lifecycle import LoadRequest
from pantheon_site.errors import LoadFailed
from pantheon_site.management.base import CommandResult, PantheonCommand, os_user


def add_load_option_arguments(parser) -> None:
    """One flag per LoadOptions field: --ctx-cap N for a count, --quantize for a flag, --dtype NAME for a choice.
    A flag left out is left out of the body, so the load gives it the catalogue's or the struct's default."""
    for option in msgspec.inspect.type_info(LoadOptions).fields:
        kind, help_text = option.type.type, option.type.extra_json_schema["description"]
        flag = "--" + option.name.replace("_", "-")
        if isinstance(kind, msgspec.inspect.BoolType):
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif isinstance(kind, msgspec.inspect.IntType):
            parser.add_argument(flag, type=int, metavar="N", help=help_text)
        else:
            choices = [v for v in kind.values if v != option.default]
            parser.add_argument(flag, choices=choices, help=help_text)


class Command(PantheonCommand):
    help = "Load a model (HF directory or GGUF file) into the running server, or catalogue it for the next start."
    operation = "model_load"

    def add_arguments(self, parser):
        parser.add_argument("path", help="a Hugging Face checkpoint directory or a .gguf file")
        parser.add_argument("--name", help="the served name (default: the file or directory name)")
        parser.add_argument("--device", help="cpu or cuda:N (default: a GPU if there is one, else cpu)")
        parser.add_argument(
            "--dies", type=_ordinals, help="CUDA die ordinals, comma-separated (2,3): one replica of the model on each"
        )
        parser.add_argument(
            "--replace",
            action="store_true",
            help="with no server running: repoint a catalogue entry of that name at another path",
        )
        add_load_option_arguments(parser)

    def audit_model(self, options: dict) -> str:
        return options.get("name") or options["path"]

    def perform(
        self, *, path: str, name: str | None, device: str | None, dies: list[int] | None, replace: bool, **options
    ) -> CommandResult:
        given = {"name": name, "device": device, "dies": dies, **{k: options[k] for k in LoadOptions.__struct_fields__}}
        body = validate_load_body({"path": path, **{k: v for k, v in given.items() if v is not None}})
        server = running_server()
        if server is not None:
            self.audit.audited_elsewhere = True  # the server audits the call it answers
            with LoadProgressBar(server, body.get("name") or _default_name(body["path"]), sys.stderr):
                row = call_admin(
                    server, "/admin/models/load", body, actor=os_user(), timeout=settings.PANTHEON_LOAD_TIMEOUT_S + 30
                )
            return CommandResult(lines=[_describe(row, server.url)])
        request = LoadRequest.from_body(body)
        checkpoint = checkpoint_at(request.path)
        name = request.name or checkpoint.default_name
        entry = CatalogModel.objects.filter(name=name).first()
        if entry is not None and entry.path != checkpoint.path and not replace:
            raise LoadFailed(
                f"the catalogue entry {name!r} is {entry.path}; pass --replace to point it at {checkpoint.path}",
                status=409,
                reason="catalogued_elsewhere",
            )
        do_catalogue_model(name, checkpoint, catalogued_options(name, request.options), device=request.device)
        lines = [
            f"No server is running: catalogued {name!r} ({checkpoint.format}, {checkpoint.path}); "
            "`manage.py serve` loads it at start."
        ]
        return CommandResult(lines=lines, model=name, details={"path": checkpoint.path, "catalogue_only": True})


def _ordinals(text: str) -> list[int]:
    """`--dies 2,3` as [2, 3]."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of die ordinals") from None


def _default_name(path: str) -> str:
    """The name the server will serve `path` under (empty when the path is no checkpoint: the server says why)."""
    try:
        return checkpoint_at(path).default_name
    except LoadFailed:
        return ""


def _describe(row: dict, url: str) -> str:
    memory = f"{row['vram_bytes'] / 2**20:.1f} MiB" if "vram_bytes" in row else "?"
    return (
        f"Loaded {row['id']!r} on {row['device']} in the server at {url} (instance #{row.get('instance_id')}): "
        f"context window {row.get('context_window')}, max_concurrent {row.get('max_concurrent')}, memory {memory}."
    )
