"""A ceiling on request bodies, as an ASGI wrapper around the whole application (inside CORS, so refusals carry it).

A body over PANTHEON_MAX_BODY_BYTES is answered 413 invalid_request_error before the application reads any of it
(a raw session file posted to POST /session/restore has its own ceiling, PANTHEON_SESSION_RESTORE_MAX_BYTES, and a
multipart upload to POST /v1/files PANTHEON_FILE_MAX_BYTES plus FORM_ALLOWANCE for the form's other parts):
at once when Content-Length declares it, or, for a chunked body (no Content-Length), as soon as the bytes received
pass the limit. The application is then told the client went away (`http.disconnect`), so Django stops reading,
and the rest of the body is never handed to it. Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check (a 400) comes only
after its ASGI handler has copied the whole body into a temporary file.

Under daphne this keeps an over-large body out of Django (its copy, the parsing, the views), not off the wire:
Twisted receives a body in full before daphne calls the application, then daphne queues all of it for the
application (dropped when the application returns). Refusing at the socket would take a hook in daphne's request.
"""

from django.conf import settings

from pantheon_site.errors import RequestTooLarge, error_response


class BodyLimitMiddleware:
    """Wraps an ASGI app: refuses a body over the limit with 413 before the app reads it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, setting = body_limit(scope)
        declared = content_length(scope)
        if declared is not None:
            # The server hands the application at most Content-Length bytes: nothing to count.
            if declared > limit:
                return await refuse(send, limit, setting)
            return await self.app(scope, receive, send)

        received = 0
        over = False
        started = False

        async def counting_receive():
            nonlocal received, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, tracking_send)
        if over and not started:
            await refuse(send, limit, setting)
        return None


RAW_RESTORE_PATH = "/session/restore"
RAW_BODY_TYPE = b"application/octet-stream"
FILES_PATH = "/v1/files"
MULTIPART_TYPE = b"multipart/form-data"
# Room for an upload's form around the file itself (boundaries, part headers, purpose, expires_after): the file's own
# size is checked exactly by batches/files.py.
FORM_ALLOWANCE = 64 * 1024


def body_limit(scope) -> tuple[int, str]:
    """The ceiling on this request's body, and the setting that sets it."""
    if scope["path"] == RAW_RESTORE_PATH and header(scope, b"content-type").startswith(RAW_BODY_TYPE):
        return settings.PANTHEON_SESSION_RESTORE_MAX_BYTES, "PANTHEON_SESSION_RESTORE_MAX_BYTES"
    if scope["path"] == FILES_PATH and header(scope, b"content-type").startswith(MULTIPART_TYPE):
        return settings.PANTHEON_FILE_MAX_BYTES + FORM_ALLOWANCE, "PANTHEON_FILE_MAX_BYTES"
    return settings.PANTHEON_MAX_BODY_BYTES, "PANTHEON_MAX_BODY_BYTES"


def header(scope, name: bytes) -> bytes:
    """A request header's value, lowercased ("" when absent)."""
    return next((value.lower() for key, value in scope["headers"] if key.lower() == name), b"")


def content_length(scope) -> int | None:
    """The request's Content-Length, or None when it has none (a chunked body) or one that is not a number."""
    try:
        return int(header(scope, b"content-length"))
    except ValueError:
        return None


async def refuse(send, limit: int, setting: str) -> None:
    """Sends the 413, rendered by the one error renderer (pantheon_site/errors.py)."""
    error = RequestTooLarge(
        f"the request body is larger than the server's limit of {limit} bytes ({setting})",
        reason="body_too_large",
    )
    response = error_response(error)
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})
