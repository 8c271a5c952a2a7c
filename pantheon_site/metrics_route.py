"""GET /metrics: every metric of the run in the Prometheus text format (pantheon_site/metrics.py).

Open to a scrape from a loopback address while PANTHEON_METRICS_OPEN_ON_LOOPBACK is on (the default): a Prometheus
agent beside the server needs no token, and such a scrape reads no database. From any other address, or with the
setting off, it needs an operator token (pantheon_site/auth.py: a refusal is 401/403 in the error envelope, audited).
A reverse proxy on the same host makes every client look local: turn the setting off behind one (docs/metrics.md).
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpResponse

from pantheon_site import metrics
from pantheon_site.auth import arequire_role
from pantheon_site.methods import only
from pantheon_site.models import Role


def from_loopback(request) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:  # no address (a test client, a unix socket): not known to be local
        return False


@only("GET")
async def metrics_view(request) -> HttpResponse:
    if not (settings.PANTHEON_METRICS_OPEN_ON_LOOPBACK and from_loopback(request)):
        await arequire_role(request, Role.OPERATOR, operation="metrics_scrape")
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)
