"""manage.py load_model PATH: load a model into the running server, or, with none running, add it to the catalogue
so that `serve` loads it at start. A Hugging Face checkpoint directory or a GGUF file.

Against a running server the command calls POST /admin/models/load with the run's local credential; the server
audits that call (as this OS user), so the command writes no audit event of its own. Without a server the command
records the catalogue change and audits it.
"""

from django.conf import settings
from django.db import transaction

from inference.api.serializers import LoadModelSerializer, validated
from inference.management.server_client import call_admin, running_server
from inference.models import CatalogModel
from inference.services.checkpoints import inspect_checkpoint
from pantheon_site.management.base import CommandResult, PantheonCommand, os_user

OPTIONS = ("ctx_cap", "max_sessions", "max_concurrent", "reasoning_budget")


class Command(PantheonCommand):
    help = "Load a model (HF directory or GGUF file) into the running server, or catalogue it for the next start."
    operation = "model_load"

    def add_arguments(self, parser):
        parser.add_argument("path", help="a Hugging Face checkpoint directory or a .gguf file")
        parser.add_argument("--name", help="the served name (default: the file or directory name)")
        parser.add_argument("--device", help="cpu or cuda:N (default: a GPU if there is one, else cpu)")
        parser.add_argument("--ctx-cap", type=int, default=0, help="per-session context window in tokens")
        parser.add_argument("--max-sessions", type=int, default=0, help="sessions that may hold KV at once")
        parser.add_argument("--max-concurrent", type=int, default=0, help="requests decoded together")
        parser.add_argument("--reasoning-budget", type=int, default=0, help="force </think> after N tokens")
        parser.add_argument("--quantize", action="store_true", help="int8-quantize the linear layers at load")

    def audit_model(self, options: dict) -> str:
        return options.get("name") or options["path"]

    def perform(self, *, path: str, name: str | None, device: str | None, quantize: bool, **options) -> CommandResult:
        body = {"path": path, "quantize": quantize, **{k: options[k] for k in OPTIONS}}
        body.update({k: v for k, v in (("name", name), ("device", device)) if v})
        body = dict(validated(LoadModelSerializer, body))
        server = running_server()
        if server is not None:
            self.operation = None  # the server audits the call it answers
            row = call_admin(server, "/admin/models/load", body, actor=os_user(),
                             timeout=settings.PANTHEON_LOAD_TIMEOUT_S + 30)  # fmt: skip
            return CommandResult(lines=[_describe(row, server.url)])
        info = inspect_checkpoint(body["path"])
        name = body.get("name") or info.default_name
        fields = {k: body[k] for k in (*OPTIONS, "quantize")}
        with transaction.atomic():
            CatalogModel.objects.update_or_create(
                name=name,
                defaults={"path": info.path, "format": info.format, "architecture": info.architecture,
                          "size_bytes": info.size_bytes, "device": body.get("device", ""), "autoload": True,
                          **fields},
            )  # fmt: skip
        lines = [f"No server is running: catalogued {name!r} ({info.format}, {info.path}); `manage.py serve` loads it "
                 "at start."]  # fmt: skip
        return CommandResult(lines=lines, model=name, details={"path": info.path, "catalogue_only": True})


def _describe(row: dict, url: str) -> str:
    memory = f"{row['vram_bytes'] / 2**20:.1f} MiB" if "vram_bytes" in row else "?"
    return (
        f"Loaded {row['id']!r} on {row['device']} in the server at {url} (instance #{row.get('instance_id')}): "
        f"context window {row.get('context_window')}, max_concurrent {row.get('max_concurrent')}, memory {memory}."
    )
