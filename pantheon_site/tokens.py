"""Access tokens: create (secret shown once), revoke, authenticate. Only an HMAC digest of a secret is ever stored.

A secret is `pth_` followed by 43 URL-safe characters (256 random bits). Nothing here logs a secret or puts one in an
exception message; callers must not either.
"""

import hashlib
import hmac
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from pantheon_site.errors import InvalidRequest, NotFound, Unauthorized
from pantheon_site.models import AccessToken, Role

SECRET_PREFIX = "pth_"
PREFIX_LENGTH = len(SECRET_PREFIX) + 4
# last_used_at is refreshed at most this often, so a busy token does not cost a write per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def token_digest(secret: str) -> str:
    """hex HMAC-SHA256 of the secret, keyed with PANTHEON_TOKEN_HMAC_KEY."""
    key = settings.PANTHEON_TOKEN_HMAC_KEY.encode()
    return hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()


def do_create_token(
    role: str, label: str, *, expires_at: datetime | None = None, secret: str | None = None
) -> tuple[AccessToken, str]:
    """Create a token; returns the row and the secret, which exists nowhere else afterwards (a new random one unless
    `secret` is given: do_install_token's, checked there).

    Raises InvalidRequest for an unknown role, an empty label or a label already in use (revoked tokens included,
    so a label always names one token in the audit log).
    """
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}", reason="bad_role")
    label = label.strip()
    if not label:
        raise InvalidRequest("label must not be empty", reason="bad_label")
    secret = secret or SECRET_PREFIX + secrets.token_urlsafe(32)
    token = AccessToken(
        label=label, role=role, digest=token_digest(secret), prefix=secret[:PREFIX_LENGTH], expires_at=expires_at
    )
    try:
        with transaction.atomic():
            token.save()
    except IntegrityError:
        raise InvalidRequest(f"a token labelled {label!r} already exists", reason="duplicate_label") from None
    return token, secret


# A secret an operator brings (do_install_token) must carry as many random characters as one made here.
MIN_SECRET_CHARS = len(SECRET_PREFIX) + 43


def do_install_token(role: str, label: str, secret: str) -> tuple[AccessToken, bool]:
    """Create a token whose secret the operator chose (a deployment's bootstrap token, kept in its secret store);
    returns the row and whether it was created. Running it again with the same role, label and secret changes
    nothing, so a deployment's setup job can run on every upgrade.

    Raises InvalidRequest for a secret that is not `pth_` and at least 43 more characters, or for a label already
    held by another token (another secret or role, or revoked): its holder must revoke it and pick a new label.
    """
    if not secret.startswith(SECRET_PREFIX) or len(secret) < MIN_SECRET_CHARS:
        raise InvalidRequest(
            f"a token secret is {SECRET_PREFIX!r} followed by at least {MIN_SECRET_CHARS - len(SECRET_PREFIX)} "
            "random URL-safe characters",
            reason="bad_secret",
        )
    if role not in Role.values:
        raise InvalidRequest(f"role must be one of {', '.join(Role.values)}", reason="bad_role")
    existing = AccessToken.objects.filter(label=label.strip()).first()
    if existing is None:
        token, _ = do_create_token(role, label, secret=secret)
        return token, True
    same = hmac.compare_digest(existing.digest, token_digest(secret)) and existing.role == role
    if not same or existing.state() != "active":
        raise InvalidRequest(
            f"a token labelled {existing.label!r} already exists with another secret or role, or is no longer active",
            reason="duplicate_label",
        )
    return existing, False


def do_revoke_token(label: str) -> AccessToken:
    """Revoke the token with this label; revoking a revoked token is a no-op. Raises NotFound for an unknown label."""
    with transaction.atomic():
        token = AccessToken.objects.select_for_update().filter(label=label).first()
        if token is None:
            raise NotFound(f"no token labelled {label!r}", reason="unknown_label")
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
    return token


def _match(candidates, secret: str) -> AccessToken:
    """The candidate whose digest equals the secret's, compared in constant time; raises Unauthorized otherwise."""
    digest = token_digest(secret)
    found = None
    for token in candidates:
        if hmac.compare_digest(token.digest, digest):
            found = token
    if found is None:
        raise Unauthorized(reason="token_unknown")
    state = found.state()
    if state != "active":
        raise Unauthorized(reason=f"token_{state}")
    return found


def _needs_touch(token: AccessToken, now: datetime) -> bool:
    return token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION


def authenticate_token(secret: str) -> AccessToken:
    """The active token this secret belongs to. Raises Unauthorized (reason token_unknown/revoked/expired)."""
    if not secret.startswith(SECRET_PREFIX):
        raise Unauthorized(reason="token_unknown")
    token = _match(AccessToken.objects.filter(prefix=secret[:PREFIX_LENGTH]), secret)
    now = timezone.now()
    if _needs_touch(token, now):
        AccessToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


async def aauthenticate_token(secret: str) -> AccessToken:
    """authenticate_token for async views (Django's async ORM; one indexed query, a write at most once a minute)."""
    if not secret.startswith(SECRET_PREFIX):
        raise Unauthorized(reason="token_unknown")
    candidates = [t async for t in AccessToken.objects.filter(prefix=secret[:PREFIX_LENGTH])]
    token = _match(candidates, secret)
    now = timezone.now()
    if _needs_touch(token, now):
        await AccessToken.objects.filter(pk=token.pk).aupdate(last_used_at=now)
        token.last_used_at = now
    return token
