"""The session routes (spec: "Session routes"): POST /admin/session/export (operator), POST /session/restore,
POST /session/release, GET /session/estimate and GET /session/watch (clients, with the /v1 token rule), and
GET /admin/sessions (operator; what `manage.py sessions` shows).

Each view parses at the edge (session_requests.py) and calls inference/services/sessions.py, which asks the worker
serving the model. Export and the session list are audited like every /admin route (operator_auth.admin_route);
release is audited by its service, which `manage.py release_session` shares.

The watch is an SSE response that sends nothing but comments: `: watch established`, then a keep-alive every
PANTHEON_SESSION_WATCH_KEEPALIVE_S. It holds the session for as long as the connection is open. When the client goes
away, daphne tells Django's ASGI handler (`http.disconnect`), which cancels the response's task: the stream's
`finally` closes the watch. A response that is closed without ever being iterated closes it too (Django calls the
streaming content's `close()`), so every watch the worker opened is closed exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from inference.api.operator_auth import admin_route, client_or_fleet, client_or_local_actor
from inference.api.session_requests import (
    parse_estimate_query,
    parse_raw_restore_request,
    parse_restore_request,
    parse_session_query,
    parse_session_target,
)
from inference.runtime.router import get_router
from inference.services import sessions
from pantheon_site.auth import arequire_client_token
from pantheon_site.methods import only

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RAW_BODY = "application/octet-stream"  # a session file's media type, on export's Accept and restore's Content-Type
WATCH_ESTABLISHED = b": watch established\n\n"
WATCH_KEEPALIVE = b": keep-alive\n\n"


@only("POST")
@admin_route("session_export", fleet=True)
async def export(request):
    """The session's most recently used conversation: blob (base64), the tokens it covers, the weights version; or,
    asked with `Accept: application/octet-stream`, the session file (inference/services/session_file.py) that
    restore takes raw."""
    target = parse_session_target(request.body)  # the body only: export ignores X-Session-Id
    request.audit.model = target.name
    raw = RAW_BODY in request.headers.get("Accept", "")
    model, body = await sessions.export_session(get_router(), target.name, target.session_id, raw=raw)
    request.audit.model = model
    request.audit.details = {"session_id": target.session_id}
    return HttpResponse(body, content_type=RAW_BODY if raw else "application/json")


@only("POST")
async def restore(request):
    """A JSON body (the spec's: blob as base64, tokens), or a session file as an application/octet-stream body with
    `name` and `session_id` in the query: the latter may be larger than PANTHEON_MAX_BODY_BYTES (body_limit.py), so
    it is read from the request's stream, past Django's check of a body's size, which applies to the JSON form."""
    await client_or_fleet(request, operation="session_restore")
    if request.content_type == RAW_BODY:
        raw = await asyncio.to_thread(request.read)
        body = await asyncio.to_thread(parse_raw_restore_request, raw, request.GET, request.headers)
    else:
        body = await asyncio.to_thread(parse_restore_request, request.body, request.headers)
    result = await sessions.restore_session(get_router(), body.name, body.session_id, body.blob, body.tokens)
    return JsonResponse(result)


@only("POST")
async def release(request):
    actor = await client_or_local_actor(request, operation="session_release")
    target = parse_session_target(request.body, request.headers)
    result = await sessions.do_release_session(
        get_router(), name=target.name, session_id=target.session_id, actor=actor
    )
    return JsonResponse(result)


@only("GET")
async def estimate(request):
    await arequire_client_token(request, operation="session_estimate")
    query = parse_estimate_query(request.GET)
    return JsonResponse(await sessions.estimate(get_router(), **query))


@only("GET")
async def watch(request):
    await arequire_client_token(request, operation="session_watch")
    target = parse_session_query(request.GET, request.headers)
    hold = await sessions.open_watch(get_router(), target.name, target.session_id)
    events = WatchEvents(hold, settings.PANTHEON_SESSION_WATCH_KEEPALIVE_S)
    return StreamingHttpResponse(events, content_type="text/event-stream", headers=SSE_HEADERS)


class WatchEvents:
    """The watch's event stream, and its `close()` for Django to call (see the module docstring)."""

    def __init__(self, hold: sessions.WatchHold, keepalive_s: float):
        self.hold = hold
        self.keepalive_s = keepalive_s

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            yield WATCH_ESTABLISHED
            while True:
                await asyncio.sleep(self.keepalive_s)
                yield WATCH_KEEPALIVE
        finally:
            self.hold.close()

    def close(self) -> None:
        self.hold.close()


@only("GET")
@admin_route("session_list")
async def list_sessions(request):
    """A model's sessions (`?name=`; absent: the default model): id, conversations, tokens, idleness, watched."""
    name = request.GET.get("name", "")
    request.audit.model = name
    result = await sessions.list_sessions(get_router(), name)
    request.audit.model = result["model"]
    return JsonResponse(result)
