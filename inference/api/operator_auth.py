"""Who may call /admin/*: an operator token (pantheon_site.auth.operator_route), or `manage.py` on this host with the
running server's local admin credential from the run file (inference/management/run_file.py). The one client route a
command calls (POST /session/release) takes that credential too (`client_or_local_actor`).

Either way the call writes exactly one audit event. A call made with the local credential is the command's own
action, so its event has actor_kind "cli" and the OS user the command reports (X-Pantheon-Actor) as its label, the
same attribution the command would have written itself; the command then writes none.
"""

from __future__ import annotations

import functools
import re
import time

from pantheon_site.audit import aaudit_request, request_actor
from pantheon_site.auth import arequire_client_token, operator_route, run_audited_view
from pantheon_site.errors import Unauthorized
from pantheon_site.local_credential import ACTOR_HEADER, matches_installed, presented_local_secret

_ACTOR = re.compile(r"[\w.@:+-]{1,100}")


def admin_route(operation: str):
    """Decorator for an async operator view: operator_route, or the local credential (see the module docstring).
    Either way the view runs as one AuditedCall, `request.audit`, on which it may name the model it acted on."""

    def decorate(view):
        with_token = operator_route(operation)(view)

        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            secret = presented_local_secret(request)
            if secret is None:
                return await with_token(request, *args, **kwargs)
            return await _local_call(view, operation, secret, request, *args, **kwargs)

        return wrapper

    return decorate


async def _local_call(view, operation: str, secret: str, request, *args, **kwargs):
    started = time.monotonic()
    actor_fields = await _local_actor(request, operation, secret, started)
    return await run_audited_view(view, request, args, kwargs, operation, started=started, **actor_fields)


async def _local_actor(request, operation: str, secret: str, started: float | None = None) -> dict:
    """The audit actor of a call made with the local credential (refused and audited when it is not this run's)."""
    if not matches_installed(secret):
        error = Unauthorized(reason="local_secret_unknown")
        await aaudit_request(request, operation, error=error, started=started)
        raise error
    actor = request.headers.get(ACTOR_HEADER, "")
    return {**request_actor(request), "actor_kind": "cli", "actor_label": actor if _ACTOR.fullmatch(actor) else ""}


async def client_or_local_actor(request, *, operation: str) -> dict:
    """For a client route that `manage.py` calls too (POST /session/release): the caller as audit actor fields.
    The local credential makes the call the command's (actor_kind "cli"); anyone else passes the /v1 token check
    (arequire_client_token: a token only with PANTHEON_REQUIRE_CLIENT_TOKENS) and is the token's holder, or
    anonymous."""
    secret = presented_local_secret(request)
    if secret is not None:
        return await _local_actor(request, operation, secret)
    return request_actor(request, await arequire_client_token(request, operation=operation))
