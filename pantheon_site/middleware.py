"""Middleware every route runs through: the request id, Django's security and framing headers, and the spec's error
envelope for raised PantheonErrors.

All of it works in Django's async stack without a thread hop on the normal path, so /v1 stays async end to end.
Django's own middleware classes (MiddlewareMixin) run their hooks through `sync_to_async` under ASGI: one hop to
the sync thread and back per hook, per request, which on a busy 2-core host cost a request milliseconds before its
view ran (docs/performance.md).
"""

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.middleware import clickjacking, security
from django.utils.deprecation import MiddlewareMixin

from inference.engine.contract.logs import request_id_var
from pantheon_site.errors import PantheonError, database_unavailable, render_error, unavailable_response
from pantheon_site.request_ids import REQUEST_ID_HEADER, SCOPE_KEY, request_id_from_header


def _request_id(request) -> str:
    """The id the ASGI layer chose (pantheon_site/request_ids.py); where Django runs without that layer (the test
    client, WSGI), one chosen the same way here."""
    scope = getattr(request, "scope", None)
    if scope and SCOPE_KEY in scope:
        return scope[SCOPE_KEY]
    return request_id_from_header(request.headers.get(REQUEST_ID_HEADER))


class BothStacks:
    """Base of a middleware that runs in Django's sync stack and, without a thread hop, in its async one: the
    subclass writes `_call` (sync) and `_acall` (async)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        return self._acall(request) if self.is_async else self._call(request)


class RequestIdMiddleware(BothStacks):
    """Sets `request.request_id` (audit events read it) and the log context, and echoes the id on the response."""

    def _call(self, request):
        request.request_id = _request_id(request)
        token = request_id_var.set(request.request_id)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response[REQUEST_ID_HEADER] = request.request_id
        return response

    async def _acall(self, request):
        request.request_id = _request_id(request)
        token = request_id_var.set(request.request_id)
        try:
            response = await self.get_response(request)
        finally:
            request_id_var.reset(token)
        response[REQUEST_ID_HEADER] = request.request_id
        return response


class ErrorEnvelopeMiddleware(MiddlewareMixin):
    """A view (sync or async) may simply raise a PantheonError; this renders it, and a database that cannot be reached
    as 503 (errors.unavailable_response). Other exceptions reach handler500."""

    def process_exception(self, request, exception):
        if isinstance(exception, PantheonError):
            return render_error(request, exception)
        if (unavailable := database_unavailable(exception)) is not None:
            return unavailable_response(request, unavailable, exception)
        return None


class OnTheEventLoop:
    """For a Django middleware class whose hooks do no I/O (they read settings and headers, and set headers): runs
    them inline on the event loop under ASGI instead of through a thread hop each."""

    async def __acall__(self, request):
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        return self.process_response(request, response) if hasattr(self, "process_response") else response


class SecurityMiddleware(OnTheEventLoop, security.SecurityMiddleware):
    """Django's: the HTTPS redirect and HSTS when configured, nosniff, the referrer and opener policies."""


class XFrameOptionsMiddleware(OnTheEventLoop, clickjacking.XFrameOptionsMiddleware):
    """Django's X-Frame-Options header."""
