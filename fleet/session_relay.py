"""A router's part in moving a session between instances: the session files it keeps and the one it restores.

- `POST /admin/session/export` sent to a router goes to the instance holding the session (the session map,
  fleet/session_store.py; the least busy when none does, which answers the instance's own 404), and the session file
  it answers with when asked for one (`Accept: application/octet-stream`; the JSON form is passed back, not kept) is
  kept as the session's restore point (PANTHEON_ROUTER_EXPORT_MAX_BYTES, PANTHEON_ROUTER_SESSION_TTL_S).
- The router never exports a session on its own: an export is the session's whole KV (megabytes to gigabytes), and
  copying it into Redis after every turn would cost every session what only an instance's loss repays. A client or
  operator that wants a restore point exports through the router when it chooses (docs/fleet.md).
- A turn whose session re-homes (its instance gone) with a kept file is preceded by `POST /session/restore` of that
  file on the new instance, so the turn finds its history there (usage cached_tokens > 0); without a file, or when the
  restore fails, the turn prefills it again (cached_tokens 0).
"""

from __future__ import annotations

import json
import logging

import httpx
from django.conf import settings
from django.http import HttpResponse

from fleet.contract import Choice, InstanceRecord, RouteRequest
from fleet.router import installed_router
from pantheon_site.errors import InvalidRequest, NoLiveInstance
from pantheon_site.fleet_credential import FLEET_TOKEN_HEADER
from pantheon_site.methods import only
from pantheon_site.request_ids import REQUEST_ID_HEADER

logger = logging.getLogger("pantheon.fleet")

RAW_BODY = "application/octet-stream"  # a session file's media type (inference/api/sessions.py)
_PASSED = ("authorization", "accept", "content-type", "x-pantheon-actor")  # what an export or restore passes on


def _headers(request, *, as_router: bool, **extra: str) -> dict[str, str]:
    """The request's id, and either the client's credentials and media types (an export passed through: the instance
    checks the client's own operator token, as it would called directly) or, for what the router does on its own
    account (a restore), the fleet token alone."""
    headers = {}
    if request is not None:
        if not as_router:
            headers = {name: value for name, value in request.headers.items() if name.lower() in _PASSED}
        headers[REQUEST_ID_HEADER] = request.request_id
    if as_router and settings.PANTHEON_FLEET_TOKEN:
        headers[FLEET_TOKEN_HEADER] = settings.PANTHEON_FLEET_TOKEN
    return headers | extra


async def restore(router, route: RouteRequest, choice: Choice, request) -> bool:
    """Restores `choice.restore_file` as `route`'s session on `choice.instance`; whether it took (else the turn
    prefills the session again, and the failure is logged)."""
    instance = choice.instance.report
    params = {"name": route.model_id, "session_id": route.session_key}
    headers = _headers(request, as_router=True, **{"Content-Type": RAW_BODY})
    try:
        response = await router.client.post(f"{instance.endpoint}/session/restore", params=params,
                                            content=choice.restore_file, headers=headers)  # fmt: skip
    except httpx.HTTPError as exc:
        logger.warning("restoring a session on %s failed: %s", instance.instance_id, type(exc).__name__)
        return False
    if response.status_code != 200:
        logger.warning("restoring a session on %s failed: HTTP %s %s", instance.instance_id, response.status_code,
                       response.text[:300])  # fmt: skip
        return False
    logger.info("a re-homed session was restored on %s from its last export", instance.instance_id)
    return True


@only("POST")
async def export_view(request):
    """POST /admin/session/export at the router (fleet/urls.py)."""
    return await export_through(installed_router(), request)


async def export_through(router, request) -> HttpResponse:
    """`POST /admin/session/export` at the router: forwarded to the session's instance, its answer passed back as it
    came, and its session file kept (module docstring)."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise InvalidRequest("the request body is not valid JSON") from None
    session_key = body.get("session_id") if isinstance(body, dict) else None
    if not isinstance(session_key, str) or not session_key:
        raise InvalidRequest("session_id: a session id is required (in the body)", reason="session_id_missing")
    live = await router.live()
    model_id = body.get("name") or _only_model(live)
    live = [record for record in live if record.report.model_id == model_id]
    if not live:
        raise NoLiveInstance(f"no live instance serves the model {model_id!r}", retry_after=1)
    target = await router.policy.home(model_id, session_key, live) or min(live, key=router.policy.load)
    response = await router.client.post(f"{target.report.endpoint}/admin/session/export", content=request.body,
                                        headers=_headers(request, as_router=False))  # fmt: skip
    if response.status_code == 200:
        await _keep(router, model_id, session_key, response)
    answer = HttpResponse(response.content, status=response.status_code,
                          content_type=response.headers.get("content-type", "application/json"))  # fmt: skip
    answer["X-Pantheon-Instance"] = target.report.instance_id
    return answer


async def _keep(router, model_id: str, session_key: str, response: httpx.Response) -> None:
    """The export's session file, kept (an answer in the JSON form is not)."""
    if not response.headers.get("content-type", "").startswith(RAW_BODY):
        return
    data = response.content
    if not await router.policy.exported(model_id, session_key, data):
        logger.info("a session's export (%d bytes) is over PANTHEON_ROUTER_EXPORT_MAX_BYTES: not kept", len(data))


def _only_model(live: list[InstanceRecord]) -> str:
    models = {record.report.model_id for record in live}
    if len(models) != 1:
        raise InvalidRequest("name: several models (or none) are served; name one")
    return models.pop()
