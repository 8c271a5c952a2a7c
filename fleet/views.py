"""The router's routes (fleet/urls.py): the registry's two (an instance's register and heartbeat, with the fleet
token), the router's /v1/models, GET / and /health for probes, and every forwarded /v1 route (fleet/forwarding.py).

The router keeps no database state: no route here queries one. A client's token is the instances' to check (the
router passes Authorization on); the registry routes take only the fleet token.
"""

from __future__ import annotations

import logging

import msgspec
from django.http import JsonResponse

from fleet.contract import InstanceReport
from fleet.forwarding import forward
from fleet.router import installed_router, model_rows, registry_errors
from pantheon_site.errors import InvalidRequest, NotFound, Unauthorized, UnknownInstance
from pantheon_site.fleet_credential import fleet_token_matches
from pantheon_site.methods import only

logger = logging.getLogger("pantheon.fleet")

_decode_report = msgspec.json.Decoder(InstanceReport).decode
# What the router forwards; the Files and Batch APIs are not among them: a file lives in one instance's folder and a
# batch runs beside the instances (docs/fleet.md).
FORWARDED = frozenset({"v1/chat/completions", "v1/completions", "v1/embeddings", "v1/responses"})


def _require_fleet_token(request) -> None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not fleet_token_matches(secret.strip()):
        raise Unauthorized("the fleet token (PANTHEON_FLEET_TOKEN) is required", reason="fleet_token")


def _report(request) -> InstanceReport:
    _require_fleet_token(request)
    try:
        return _decode_report(request.body)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"not an instance report: {exc}") from None
    except msgspec.DecodeError:
        raise InvalidRequest("the request body is not valid JSON") from None


@only("POST")
async def register(request):
    report = _report(request)
    with registry_errors():
        await installed_router().registry.register(report)
    logger.info("instance %s registered (%s at %s)", report.instance_id, report.model_id, report.endpoint)
    return JsonResponse({"registered": report.instance_id})


@only("POST")
async def heartbeat(request):
    report = _report(request)
    with registry_errors():
        known = await installed_router().registry.heartbeat(report)
    if not known:
        raise UnknownInstance(f"the instance {report.instance_id} is not registered; register it again")
    return JsonResponse({"live": report.instance_id})


@only("GET")
async def list_models(request):
    """The router's shape (spec): one row per model id over the live instances, with live, free_slots and the
    minimum context_window."""
    return JsonResponse({"object": "list", "data": model_rows(await installed_router().live())})


@only("GET")
async def root(request):
    """What is running: a router, and how many live instances it sees."""
    live = await installed_router().live()
    return JsonResponse({"status": "ok", "role": "router", "instances": len(live),
                         "models": sorted({record.report.model_id for record in live})})  # fmt: skip


@only("GET")
async def health(request):
    """For probes: 200 while the registry answers, else 503 service_unavailable."""
    with registry_errors():
        await installed_router().registry.ping()
    return JsonResponse({"status": "ok"})


async def forwarded(request, path: str):
    """POST /v1/<path>: to the instance the routing policy picks (fleet/forwarding.py)."""
    route = f"v1/{path}"
    if request.method != "POST" or route not in FORWARDED:
        raise NotFound(f"the router does not forward {request.method} /{route}; call an instance for it")
    return await forward(installed_router(), request, route)
