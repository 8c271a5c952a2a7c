"""The one write point of pantheon_requests_total and pantheon_request_duration_seconds: a middleware every Django
route runs through (the views, their errors and the 404 of an unknown path alike).

A request counts when its last byte is sent: a JSON answer when the view returns, a stream (SSE, a session watch)
when its body ends, however it ends (a client that goes away included). `route` is the URL pattern that matched
("/v1/chat/completions", "/v1/responses/<str:response_id>"; "unmatched" for an unknown path), so a label never holds
a client's free text; `model` is the served model a generation was routed to (`label_model`), "" otherwise. What
never reaches Django is not counted: CORS preflights, a body refused for its size, the UI's static files
(pantheon_site/asgi.py). Like the other middleware here it runs on the event loop, without a thread hop.
"""

from __future__ import annotations

import time

from inference.engine.contract.metrics import REQUEST_DURATION, REQUESTS
from pantheon_site.middleware import BothStacks

UNMATCHED = "unmatched"


def label_model(request, model: str) -> None:
    """Names the served model `request` was routed to, for its metrics' `model` label."""
    request.metrics_model = model


class RequestMetricsMiddleware(BothStacks):
    def _call(self, request):
        return self._counted(request, time.monotonic(), self.get_response(request))

    async def _acall(self, request):
        started = time.monotonic()
        return self._counted(request, started, await self.get_response(request))

    def _counted(self, request, started: float, response):
        if not response.streaming:
            _record(request, response.status_code, started)
            return response
        body = response.streaming_content
        if response.is_async:
            response.streaming_content = _async_counted(body, request, response.status_code, started)
        else:
            response.streaming_content = _sync_counted(body, request, response.status_code, started)
        return response


def _record(request, status: int, started: float) -> None:
    match = getattr(request, "resolver_match", None)
    route = "/" + match.route if match is not None else UNMATCHED
    model = getattr(request, "metrics_model", "")
    REQUESTS.labels(route, model, str(status)).inc()
    REQUEST_DURATION.labels(route, model).observe(time.monotonic() - started)


async def _async_counted(body, request, status: int, started: float):
    try:
        async for chunk in body:
            yield chunk
    finally:
        _record(request, status, started)


def _sync_counted(body, request, status: int, started: float):
    try:
        yield from body
    finally:
        _record(request, status, started)
