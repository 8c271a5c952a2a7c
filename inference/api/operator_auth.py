"""Who may call /admin/*: an operator token (pantheon_site.auth.operator_route), or `manage.py` on this host with the
running server's local admin credential from the run file (inference/management/run_file.py). The one client route a
command calls (POST /session/release) takes that credential too (`client_or_local_actor`).

Behind the fleet's router, the session export and restore routes also take the router's identity: the fleet token
(PANTHEON_FLEET_TOKEN) in X-Pantheon-Fleet-Token (pantheon_site/fleet_credential.py), audited with actor_kind
"system" and the label "router", so a router can move a session's KV to another instance (docs/fleet.md).

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
from pantheon_site.fleet_credential import fleet_token_matches, presented_fleet_token
from pantheon_site.local_credential import ACTOR_HEADER, matches_installed, presented_local_secret

_ACTOR = re.compile(r"[\w.@:+-]{1,100}")
FLEET_ACTOR = {"actor_kind": "system", "actor_label": "router"}


def admin_route(operation: str, *, fleet: bool = False):
    """Decorator for an async operator view: operator_route, or the local credential, or with `fleet` the fleet
    token (see the module docstring). Either way the view runs as one AuditedCall, `request.audit`, on which it may
    name the model it acted on."""

    def decorate(view):
        with_token = operator_route(operation)(view)

        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            if fleet and (presented := presented_fleet_token(request)) is not None:
                started = time.monotonic()
                actor = await _fleet_actor(request, operation, presented, started)
                return await run_audited_view(view, request, args, kwargs, operation, started=started, **actor)
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


async def _fleet_actor(request, operation: str, presented: str, started: float | None = None) -> dict:
    """The router's audit actor, for a call carrying this fleet's token (refused and audited when it is not)."""
    if not fleet_token_matches(presented):
        error = Unauthorized(reason="fleet_token_unknown")
        await aaudit_request(request, operation, error=error, started=started)
        raise error
    return {**request_actor(request), **FLEET_ACTOR}


async def client_or_fleet(request, *, operation: str) -> None:
    """For a client route the fleet's router calls too (POST /session/restore): the fleet token makes the call the
    router's; anyone else passes the /v1 token check (arequire_client_token)."""
    if (presented := presented_fleet_token(request)) is not None:
        await _fleet_actor(request, operation, presented)
        return
    await arequire_client_token(request, operation=operation)


async def client_or_local_actor(request, *, operation: str) -> dict:
    """For a client route that `manage.py` calls too (POST /session/release): the caller as audit actor fields.
    The local credential makes the call the command's (actor_kind "cli"); anyone else passes the /v1 token check
    (arequire_client_token: a token only with PANTHEON_REQUIRE_CLIENT_TOKENS) and is the token's holder, or
    anonymous."""
    secret = presented_local_secret(request)
    if secret is not None:
        return await _local_actor(request, operation, secret)
    return request_actor(request, await arequire_client_token(request, operation=operation))
