"""manage.py release_session SESSION_ID [--model M]: free a session of the running server now, as POST
/session/release does (the same service, which audits the call as this command's)."""

from inference.management.server_client import call_admin, running_server
from pantheon_site.errors import NoModelsLoaded
from pantheon_site.management.base import CommandResult, PantheonCommand, os_user

CALL_TIMEOUT_S = 30.0


class Command(PantheonCommand):
    help = "Free a session's KV in the running server now instead of waiting for its idle timeout."
    operation = "session_release"

    def add_arguments(self, parser):
        parser.add_argument("session_id", help="the session id (see manage.py sessions)")
        parser.add_argument("--model", default="", help="the served name (default: the one model served)")

    def audit_model(self, options: dict) -> str:
        return options.get("model") or ""

    def perform(self, *, session_id: str, model: str, **options) -> CommandResult:
        server = running_server()
        if server is None:
            raise NoModelsLoaded("no server is running, so no session is held", reason="no_server")
        self.audit.audited_elsewhere = True  # the server audits the call it answers
        body = {"session_id": session_id, **({"name": model} if model else {})}
        call_admin(server, "/session/release", body, actor=os_user(), timeout=CALL_TIMEOUT_S)
        where = f" of {model!r}" if model else ""
        return CommandResult(lines=[f"Released session {session_id!r}{where} on the server at {server.url}."])
