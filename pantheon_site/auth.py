"""Bearer-token checks for routes: operator routes always, /v1 only when PANTHEON_REQUIRE_CLIENT_TOKENS is set.

A missing, malformed, unknown, revoked or expired token is 401 Unauthorized (WWW-Authenticate: Bearer); a valid
token over its rate limit (pantheon_site/rate_limit.py) is 429 RateLimited with Retry-After; a valid token of a role
the route does not admit is 403 Forbidden. Every refusal raised here is audited before it is raised,
so a route that lets it propagate has written its one audit event. `operator_route` goes further: it runs the view as
one AuditedCall (pantheon_site/audit.py), which audits the accepted call or the error the view raised, so a view
decorated with it writes no audit code at all.
"""

import functools
import time
from collections.abc import Callable

from django.conf import settings

from pantheon_site.audit import AuditedCall, aaudit_request, audit_request, request_actor
from pantheon_site.errors import Forbidden, PantheonError, Unauthorized
from pantheon_site.local_credential import matches_installed, presented_local_secret
from pantheon_site.models import AccessToken, Role
from pantheon_site.rate_limit import check_rate
from pantheon_site.tokens import aauthenticate_token, authenticate_token

CLIENT_ROLES = (Role.CLIENT, Role.TRAINER, Role.OPERATOR)

ErrorMap = Callable[[PantheonError], PantheonError]


def bearer_secret(request) -> str:
    """The token of `Authorization: Bearer <token>`; raises Unauthorized when the header is missing or malformed."""
    header = request.headers.get("Authorization", "")
    if not header:
        raise Unauthorized(reason="token_missing")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Unauthorized(reason="token_malformed")
    return secret.strip()


def _admit(token: AccessToken, roles: tuple[str, ...]) -> None:
    """The token's call counts against its rate limit (refused ones too), then its role must be one of `roles`."""
    check_rate(token.digest)
    if token.role not in roles:
        raise Forbidden(f"a {token.role} token may not call this route", reason=f"role_{token.role}")


def require_role(request, *roles: str, operation: str) -> AccessToken:
    """The request's token if its role is one of `roles`; otherwise audits the refusal and raises it."""
    token = None
    try:
        token = authenticate_token(bearer_secret(request))
        _admit(token, roles)
    except PantheonError as error:
        audit_request(request, operation, token=token, error=error)
        raise
    return token


async def arequire_role(
    request, *roles: str, operation: str, as_error: ErrorMap | None = None, started: float | None = None
) -> AccessToken:
    """require_role for async views. `as_error` turns the refusal (Unauthorized, Forbidden) into the error of the
    route's family before it is audited and raised (the weights routes' WEIGHTS_UNAUTHORIZED, WEIGHTS_FORBIDDEN,
    RATE_LIMITED);
    `started` (time.monotonic()) times the refused event."""
    token = None
    try:
        token = await aauthenticate_token(bearer_secret(request))
        _admit(token, roles)
    except PantheonError as error:
        refusal = as_error(error) if as_error is not None else error
        await aaudit_request(request, operation, token=token, error=refusal, started=started)
        if refusal is error:
            raise
        raise refusal from None
    return token


async def arequire_client_token(request, *, operation: str) -> AccessToken | None:
    """For /v1 routes: None, without touching the database, unless PANTHEON_REQUIRE_CLIENT_TOKENS is set; then a
    client, trainer or operator token is required (refusals audited), or the running server's local credential
    (pantheon_site/local_credential.py: what the Celery worker running batches on this host presents), which is
    no token (None) and so counts against no rate limit; a local-kind secret that is not this run's is 401."""
    if not settings.PANTHEON_REQUIRE_CLIENT_TOKENS:
        return None
    if (secret := presented_local_secret(request)) is not None:
        if matches_installed(secret):
            return None
        error = Unauthorized(reason="local_secret_unknown")
        await aaudit_request(request, operation, error=error)
        raise error
    return await arequire_role(request, *CLIENT_ROLES, operation=operation)


def operator_route(operation: str, roles: tuple[str, ...] = (Role.OPERATOR,)):
    """Decorator for an async view: checks the token, sets `request.access_token`, and runs the view as one
    AuditedCall (`request.audit`), so the call writes one audit event — refused with the error the view raised, else
    accepted. A view that knows which model it acted on sets `request.audit.model` (and optionally
    `request.audit.details`, a dict) before returning or raising."""

    def decorate(view):
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            started = time.monotonic()
            request.access_token = await arequire_role(request, *roles, operation=operation)
            actor = request_actor(request, request.access_token)
            return await run_audited_view(view, request, args, kwargs, operation, started=started, **actor)

        return wrapper

    return decorate


async def run_audited_view(view, request, args, kwargs, operation: str, *, started: float, **actor):
    """Runs an async view as one AuditedCall by `actor` (its fields: actor_kind, actor_label, request_id,
    client_address), set as `request.audit` for the view to name what it acted on."""
    async with AuditedCall(operation, started=started, **actor) as call:
        request.audit = call
        return await view(request, *args, **kwargs)
