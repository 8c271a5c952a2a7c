"""manage.py unload_model NAME: unload a model from the running server (draining its generations first), or, with
none running, keep `serve` from loading it at start. `--id` picks one instance by its id instead of a name.

As with load_model, a call to a running server is audited by the server, a catalogue change by this command.
"""

from django.conf import settings

from inference.management.server_client import call_admin, running_server
from inference.models import CatalogModel
from pantheon_site.errors import InvalidRequest, UnloadFailed
from pantheon_site.management.base import CommandResult, PantheonCommand, os_user


class Command(PantheonCommand):
    help = "Unload a model from the running server, or stop `serve` from loading it at start."
    operation = "model_unload"

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="the served name")
        parser.add_argument("--id", type=int, dest="instance_id", help="unload this instance (see list_models)")

    def audit_model(self, options: dict) -> str:
        return options.get("name") or ""

    def perform(self, *, name: str | None, instance_id: int | None, **options) -> CommandResult:
        if not name and instance_id is None:
            raise InvalidRequest("name a model, or an instance with --id", reason="missing_name")
        server = running_server()
        if server is not None:
            self.audit.audited_elsewhere = True  # the server audits the call it answers
            body = {"name": name} if name else {}
            if instance_id is not None:
                body["id"] = instance_id
            result = call_admin(server, "/admin/models/unload", body, actor=os_user(),
                                timeout=settings.PANTHEON_UNLOAD_DRAIN_TIMEOUT_S + 60)  # fmt: skip
            aborted = result.get("aborted", 0)
            note = f"; {aborted} generation(s) still running at the drain timeout were ended" if aborted else ""
            return CommandResult(lines=[f"Unloaded {result['unloaded']!r} from the server at {server.url}{note}."])
        if not name:
            raise UnloadFailed("no server is running, so there are no instances; name the model", status=404,
                               reason="no_server")  # fmt: skip
        if not CatalogModel.objects.filter(name=name).update(autoload=False):
            raise UnloadFailed(f"model {name!r} is not in the catalogue", status=404, reason="not_catalogued")
        lines = [f"No server is running: {name!r} stays in the catalogue but `manage.py serve` will not load it."]
        return CommandResult(lines=lines, model=name, details={"catalogue_only": True})
