"""Where a batch's lines are sent: the server named by PANTHEON_SERVER_URL with PANTHEON_SERVER_TOKEN (a Celery
worker on another host), else the `serve` of this host found through its run file, presenting the run's local
credential. Looked up again whenever the server stops answering, since a restarted server has a new credential."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from inference.management.server_client import running_server


@dataclass(frozen=True, slots=True)
class ServerTarget:
    url: str  # e.g. http://127.0.0.1:8000, no trailing slash
    token: str  # presented as Bearer; empty: no Authorization header


def find_server() -> ServerTarget | None:
    """The server to send lines to, or None when none runs (the batch waits: server_unavailable)."""
    if settings.PANTHEON_SERVER_URL:
        return ServerTarget(settings.PANTHEON_SERVER_URL, settings.PANTHEON_SERVER_TOKEN)
    info = running_server()
    return ServerTarget(info.url, info.admin_secret) if info is not None else None
