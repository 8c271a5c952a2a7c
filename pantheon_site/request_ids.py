"""The request id: chosen once per HTTP request, outside everything else, and on every response and log line.

`RequestIdLayer` wraps the whole ASGI application (asgi.py), outside CORS and the body limit, so a response that a
layer inside it answers by itself (a preflight, a 413 before Django, a static file, a 500) carries `X-Request-ID` as
well as what Django answers. The id is the client's `X-Request-ID` when it is a short plain token (safe in a log
line), else a new uuid4 hex. It is set in `request_id_var` (inference/engine/contract/logs.py) for the request's
task, so every log line of the request carries it; in the scope (`SCOPE_KEY`), where Django's RequestIdMiddleware
reads it for `request.request_id` (audit events); and, through the engine client, in the SUBMIT of each generation,
so the worker's lines about the sequence carry it too.

The layer writes one access line per request when it ends (`pantheon.access`: method, path, status, duration). The
query string is left out: what a client puts there is not the operator's to keep.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from inference.engine.contract.logs import request_id_var

REQUEST_ID_HEADER = "X-Request-ID"
SCOPE_KEY = "pantheon.request_id"
_HEADER_KEY = REQUEST_ID_HEADER.lower().encode()
_ACCEPTABLE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")

access_log = logging.getLogger("pantheon.access")


def request_id_from_header(value: str | None) -> str:
    """The client's X-Request-ID when it is a short plain token (so it is safe in logs), else a new uuid4 hex."""
    if value and _ACCEPTABLE_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def _client_id(scope) -> str | None:
    value = next((v for k, v in scope["headers"] if k.lower() == _HEADER_KEY), None)
    return value.decode("latin-1") if value is not None else None


class RequestIdLayer:
    """Wraps an ASGI app: gives each HTTP request its id (scope, context, response header) and its access line."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_from_header(_client_id(scope))
        scope = {**scope, SCOPE_KEY: request_id}
        token = request_id_var.set(request_id)
        started = time.monotonic()
        status = None
        header = (_HEADER_KEY, request_id.encode())

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != _HEADER_KEY]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        try:
            return await self.app(scope, receive, send_with_id)
        finally:
            elapsed_ms = (time.monotonic() - started) * 1000
            access_log.info("%s %s %s %.1f ms", scope["method"], scope["path"], status or "-", elapsed_ms)
            request_id_var.reset(token)
