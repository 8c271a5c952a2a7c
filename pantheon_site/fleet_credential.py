"""The fleet token (PANTHEON_FLEET_TOKEN): the one secret a router and its serve instances present to each other.

An instance presents it as a bearer token on `POST /registry/register` and `/registry/heartbeat`; a router presents it
in `X-Pantheon-Fleet-Token` on every request it sends an instance, where the session export and restore routes take
it as the router's identity (inference/api/operator_auth.py). Compared in constant time, never logged. Its home is
here, below both the router (fleet/) and the instance's routes (inference/api), as the local credential's is."""

from __future__ import annotations

import hmac

from django.conf import settings

FLEET_TOKEN_HEADER = "X-Pantheon-Fleet-Token"


def fleet_token_matches(presented: str | None) -> bool:
    """Whether `presented` is this fleet's token; always False while PANTHEON_FLEET_TOKEN is empty."""
    expected = settings.PANTHEON_FLEET_TOKEN
    if not expected or presented is None:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


def presented_fleet_token(request) -> str | None:
    """The fleet token a request carries in X-Pantheon-Fleet-Token (whether it is this fleet's is for
    `fleet_token_matches` to say), else None."""
    return request.headers.get(FLEET_TOKEN_HEADER)
