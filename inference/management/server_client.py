"""How `manage.py load_model`, `unload_model`, `sessions` and `release_session` talk to a running server: found
through the run file, called on its operator routes (and POST /session/release) with the run's local admin
credential (inference/management/run_file.py).

Plain urllib: the commands need no HTTP client library, and a call is one small JSON request on localhost.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from inference.management.run_file import RunInfo, pid_alive, read_run_file
from pantheon_site.errors import PantheonError
from pantheon_site.local_credential import ACTOR_HEADER

PROBE_TIMEOUT_S = 3.0


class ServerRefused(PantheonError):
    """The running server answered an operator call with an error; carries its status, type and message."""

    def __init__(self, status: int, type_: str, message: str):
        self.status, self.type = status, type_
        super().__init__(message, reason="server_refused")


def running_server() -> RunInfo | None:
    """The server the run file names, if its process lives and it answers GET /; None otherwise."""
    info = read_run_file()
    if info is None or not pid_alive(info.pid):
        return None
    try:
        with urllib.request.urlopen(info.url + "/", timeout=PROBE_TIMEOUT_S) as response:
            return info if response.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def call_admin(
    server: RunInfo, path: str, body: dict[str, Any] | None, *, actor: str, timeout: float, query: dict | None = None
) -> dict[str, Any]:
    """POSTs `body` to a route with the run's local credential (a GET when `body` is None, with `query`); returns
    the JSON answer, or raises ServerRefused with the server's error."""
    url = server.url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {server.admin_secret}",
            ACTOR_HEADER: actor,
        },  # fmt: skip
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            error = json.loads(exc.read())["error"]
            raise ServerRefused(exc.code, error["type"], error["message"]) from None
        except (ValueError, KeyError, TypeError):
            raise ServerRefused(exc.code, "server_error", f"the server answered HTTP {exc.code}") from None
