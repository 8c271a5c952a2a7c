"""The local admin credential: a random secret of one `serve` run, which `manage.py` commands on the same host read
from the run file (inference/management/run_file.py) and present instead of an operator token.

Its one home, below both who mints it (`serve`), who presents it (the commands, and the Celery worker that runs
batches on this host) and who checks it (the operator routes, inference/api/operator_auth.py; the /v1 routes,
pantheon_site/auth.py)."""

from __future__ import annotations

import hmac
import secrets

LOCAL_SECRET_PREFIX = "pthl_"  # told apart from database tokens (pth_) before any lookup
ACTOR_HEADER = "X-Pantheon-Actor"  # the OS user a command reports, the audit event's actor label

_installed: str | None = None


def new_admin_secret() -> str:
    return LOCAL_SECRET_PREFIX + secrets.token_urlsafe(32)


def install_local_secret(secret: str | None) -> None:
    """The credential of this run (serve sets it when it writes the run file; None refuses every local call)."""
    global _installed
    _installed = secret


def is_local_secret(secret: str) -> bool:
    """Whether a presented bearer secret is of the local kind (checked before any token lookup)."""
    return secret.startswith(LOCAL_SECRET_PREFIX)


def presented_local_secret(request) -> str | None:
    """The bearer secret of a request when it is of the local kind (whether it is this run's is for
    `matches_installed` to say), else None."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    secret = secret.strip()
    if scheme.lower() == "bearer" and is_local_secret(secret):
        return secret
    return None


def matches_installed(given: str) -> bool:
    """Constant-time comparison of a presented local credential with this run's."""
    return _installed is not None and hmac.compare_digest(given.encode(), _installed.encode())
