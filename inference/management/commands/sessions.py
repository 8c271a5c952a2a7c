"""manage.py sessions [--model M]: the sessions a running server's model holds (GET /admin/sessions)."""

from inference.management.server_client import call_admin, running_server
from pantheon_site.errors import NoModelsLoaded
from pantheon_site.management.base import CommandResult, PantheonCommand, format_table, os_user

CALL_TIMEOUT_S = 30.0


def ago(seconds: float) -> str:
    """e.g. "4 s ago", "12 min ago", "3.5 h ago"."""
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


class Command(PantheonCommand):
    help = "List the sessions a model of the running server holds: id, conversations, tokens, last use, watched."

    def add_arguments(self, parser):
        parser.add_argument("--model", default="", help="the served name (default: the one model served)")

    def perform(self, *, model: str, **options) -> CommandResult:
        server = running_server()
        if server is None:
            raise NoModelsLoaded("no server is running, so no sessions are held", reason="no_server")
        query = {"name": model} if model else None
        result = call_admin(server, "/admin/sessions", None, query=query, actor=os_user(), timeout=CALL_TIMEOUT_S)
        if not result["data"]:
            return CommandResult(lines=[f"{result['model']!r} holds no sessions."])
        rows = [
            [s["session_id"], str(s["conversations"]), str(s["tokens"]), ago(s["idle_seconds"]),
             "yes" if s["watched"] else "no", "yes" if s["busy"] else "no"]
            for s in result["data"]
        ]  # fmt: skip
        headers = ["SESSION", "CONVERSATIONS", "TOKENS", "LAST USE", "WATCHED", "BUSY"]
        return CommandResult(lines=[f"Sessions of {result['model']!r}:", *format_table(headers, rows)])
