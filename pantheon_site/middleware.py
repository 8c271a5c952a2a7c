"""Middleware every route runs through: the request id, and the spec's error envelope for raised PantheonErrors.

Both work in Django's async stack without a thread hop on the normal path, so /v1 stays async end to end.
Channels consumers (SSE) do not pass through Django middleware: they call `request_id_from_header` themselves.
"""

import re
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.utils.deprecation import MiddlewareMixin

from pantheon_site.errors import PantheonError, render_error

REQUEST_ID_HEADER = "X-Request-Id"
_ACCEPTABLE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def request_id_from_header(value: str | None) -> str:
    """The client's X-Request-Id when it is a short plain token (so it is safe in logs), else a new uuid4 hex."""
    if value and _ACCEPTABLE_ID.fullmatch(value):
        return value
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Sets `request.request_id` (from X-Request-Id or new) and echoes it on the response, for audit and logs."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        request.request_id = request_id_from_header(request.headers.get(REQUEST_ID_HEADER))
        response = self.get_response(request)
        response[REQUEST_ID_HEADER] = request.request_id
        return response

    async def _acall(self, request):
        request.request_id = request_id_from_header(request.headers.get(REQUEST_ID_HEADER))
        response = await self.get_response(request)
        response[REQUEST_ID_HEADER] = request.request_id
        return response


class ErrorEnvelopeMiddleware(MiddlewareMixin):
    """A view (sync or async) may simply raise a PantheonError; this renders it. Other exceptions reach handler500."""

    def process_exception(self, request, exception):
        if isinstance(exception, PantheonError):
            return render_error(request, exception)
        return None
