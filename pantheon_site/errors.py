"""The spec's error types as exceptions, and the one place that turns them into HTTP responses.

Code anywhere in a request raises one of these; `ErrorEnvelopeMiddleware` (plain Django views), the DRF exception
handler (DRF views) and Django's handler404/400/500 (set in urls.py) all end in `error_response`, so every route
answers in its envelope with the spec's status, `type` and headers. Two envelopes exist:

* OpenAI-style `{"error": {"message", "type", "code": null}}` for `/`, `/v1/*`, `/admin/*`, `/session/*` (plus
  `param`, the request field at fault, when the error names one, as the Files and Batch routes' errors do);
* management-style `{"success": false, "data": null, "error": {"code", "message", "reason", "details"}}` for
  `/api/weights/*`: a `ManagementError` (weights/errors.py) renders itself so, and `handler404` answers an unknown
  path under /api/weights/ in it too.

Under the operator UI's `/ui/` the same errors are an HTML page instead (`render_error`).

A database that cannot be reached (PostgreSQL stopped, restarting, the network to it down) is not a bug in the route:
`database_unavailable` maps Django's OperationalError/InterfaceError from a failed connection to `ServiceUnavailable`
(503 with Retry-After), and `unavailable_response` answers it in the route's envelope with one log line and no
traceback, wherever it was raised (a view, a middleware, an audit write).
"""

import logging
import math
import sys

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from rest_framework import exceptions as drf

logger = logging.getLogger("pantheon.errors")


class PantheonError(Exception):
    """Base of every error a client can see. Subclasses fix `status` and `type`; instances carry the message.

    `reason` is a short machine word for the audit log (never shown to the client); `headers` go on the response.
    `code` and `param` (OpenAI's: what went wrong, and which request field) may be given per instance.
    """

    status: int = 500
    type: str = "server_error"
    code: str | None = None  # the OpenAI envelope's `code` (null unless the error names one)
    param: str | None = None  # the OpenAI envelope's `param`: sent only when the error names one
    default_message: str = "internal server error"

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: str = "",
        headers: dict[str, str] | None = None,
        code: str | None = None,
        param: str | None = None,
    ):
        self.message = message or self.default_message
        self.reason = reason
        if code is not None:
            self.code = code
        if param is not None:
            self.param = param
        self.headers = {**self.default_headers(), **(headers or {})}
        super().__init__(self.message)

    def default_headers(self) -> dict[str, str]:
        return {}

    @property
    def audit_type(self) -> str:
        """What the audit log records as the error's type (`error_type`)."""
        return self.type

    def stream_fields(self) -> dict:
        """Extra keys of the error object when it is sent as a terminal SSE event (after the status is sent)."""
        return {}


class InvalidRequest(PantheonError):
    """400: empty or malformed body, body not an object, a required field missing or out of range."""

    status, type, default_message = 400, "invalid_request_error", "invalid request"


class RequestTooLarge(PantheonError):
    """413: the body is larger than PANTHEON_MAX_BODY_BYTES; refused before it is read (pantheon_site/body_limit.py)."""

    status, type, default_message = 413, "invalid_request_error", "the request body is too large"


class NotFound(PantheonError):
    """404 for any path (or method) the spec does not list."""

    status, type, default_message = 404, "not_found", "unknown route"


class ModelNotFound(PantheonError):
    """404: several models are loaded and the request's `model` names none of them."""

    status, type, default_message = 404, "model_not_found", "model not found"


class ContextOverBudget(PantheonError):
    """422: the prompt does not fit the effective per-session window. Not transient.

    Non-streaming, kv_used/kv_cap are in the message text; streaming, they are also fields of the error object.
    """

    status, type = 422, "context_over_budget"

    def __init__(self, kv_used: int, kv_cap: int, message: str | None = None, **kwargs):
        self.kv_used, self.kv_cap = kv_used, kv_cap
        text = message or f"prompt exceeds the context window: kv_used={kv_used}, kv_cap={kv_cap}"
        super().__init__(text, **kwargs)

    def stream_fields(self) -> dict:
        return {"kv_used": self.kv_used, "kv_cap": self.kv_cap}


class _RetryableError(PantheonError):
    """An error that may carry Retry-After (seconds, rounded up); None leaves the header out."""

    default_retry_after: float | None = None

    def __init__(self, message: str | None = None, *, retry_after: float | None = None, **kwargs):
        self.retry_after = retry_after if retry_after is not None else self.default_retry_after
        super().__init__(message, **kwargs)

    def default_headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(0, math.ceil(self.retry_after)))}


class ServerBusy(_RetryableError):
    """429: the model is decoding at capacity and the queue is full, or the queue wait timed out."""

    status, type, default_message = 429, "server_busy", "the model is busy; retry shortly"


class RateLimited(_RetryableError):
    """429: the token has made PANTHEON_RATE_LIMIT_PER_MINUTE calls in the last minute (pantheon_site/rate_limit.py);
    Retry-After says when its next call is admitted."""

    status, type, code = 429, "rate_limited", "rate_limit_exceeded"  # OpenAI's code for its own rate limits
    default_message = "this token's rate limit is reached; retry after Retry-After"


class ModelAtSessionCapacity(_RetryableError):
    """429: a new session id while every session slot holds a live session."""

    status, type, default_message = 429, "model_at_session_capacity", "every session slot is in use"
    default_retry_after = 30


class SessionCachingDisabled(PantheonError):
    """400: a session route on a model that keeps no sessions (max_sessions 0, or PANTHEON_SESSIONS off)."""

    status, type, default_message = 400, "session_caching_disabled", "this model has no session cache"


class SessionNotFound(PantheonError):
    """404: no live session with that id (never started, released, or reaped for idleness)."""

    status, type, default_message = 404, "session_not_found", "no live session with that id"


class SessionBusy(PantheonError):
    """429: a turn is in flight on that session; retry after it completes. The spec gives no Retry-After."""

    status, type, default_message = 429, "session_busy", "a turn is in flight on that session"


class BadSessionBlob(PantheonError):
    """400: a session blob that is not base64, is corrupt, comes from another architecture or does not fit the
    model. Nothing was changed."""

    status, type, default_message = 400, "bad_session_blob", "not a usable session blob"


class WeightsVersionMismatch(PantheonError):
    """409: a session blob captured under other weights; replay the conversation instead."""

    status, type = 409, "weights_version_mismatch"
    default_message = "the blob was captured under different weights; replay the conversation instead"


class WatchUnavailable(PantheonError):
    """503: the server holds PANTHEON_SESSION_MAX_WATCHES watches already (the spec's "its table is full")."""

    status, type, default_message = 503, "watch_unavailable", "no more session watches can be held"


class NoModelsLoaded(PantheonError):
    """503: nothing is loaded and the request named nothing the catalogue could load."""

    status, type, default_message = 503, "no_models_loaded", "no model is loaded"


class ServerMemoryConstrained(_RetryableError):
    """503: memory pressure made admission refuse the request."""

    status, type, default_message = 503, "server_memory_constrained", "server memory is constrained"


class ServerShuttingDown(_RetryableError):
    """503: the server is draining for shutdown; the route refusal says retry in a second."""

    status, type, default_message = 503, "server_shutting_down", "server is shutting down"
    default_retry_after = 1


class ModelReloading(_RetryableError):
    """503: the model's worker crashed and the model is being loaded again; retry after Retry-After. Not in the
    spec's table (docs/api/choices.md): a client should wait, not give up as on a 500."""

    status, type, default_message = 503, "model_reloading", "the model is being reloaded after a worker crash"


class ServiceUnavailable(_RetryableError):
    """503: a service the route needs (the database) cannot be reached right now; the route changed nothing that
    stays changed. Retry-After: PANTHEON_RETRY_AFTER_UNAVAILABLE_S."""

    status, type, default_message = 503, "service_unavailable", "a service the server needs is unavailable"


class WeightsTorn(_RetryableError):
    """503: the model's weights are torn (a commit overran the watchdog or broke off); nothing is served until
    POST /api/weights/load restores them. Not in the spec's /v1 table (docs/api/choices.md)."""

    status, type = 503, "weights_torn"
    default_message = "the weights are torn; they are restored with POST /api/weights/load"


class WeightsHeld(_RetryableError):
    """503: a batch-priority request (X-Pantheon-Priority: batch) for a model whose weights a trainer holds (the
    barrier quiesced, a commit writing, a weights load in progress); interactive requests wait in the queue instead.
    The Batch API's runner waits Retry-After (WEIGHTS_HOLD_TIMEOUT_S) and sends the line again. Not in the spec's
    /v1 table (docs/api/choices.md)."""

    status, type = 503, "weights_held"
    default_message = "a trainer holds the weights; batch work waits until it resumes"


class WeightsUnsaved(PantheonError):
    """409 weights_unsaved (typed invalid_request_error): loading the named model would discard the resident
    model's commits that no checkpoint records. Nothing was loaded or unloaded."""

    status, type, code = 409, "invalid_request_error", "weights_unsaved"


class NoLiveInstance(_RetryableError):
    """503 (the fleet's router, docs/fleet.md): no live instance serves the request's model, or none could be
    reached; Retry-After is one registry heartbeat, when an instance may have registered."""

    status, type, default_message = 503, "no_live_instance", "no live instance serves this model"


class InstanceFailed(PantheonError):
    """502 (the fleet's router): the instance a request was forwarded to failed before it answered in full (it
    died, or its connection broke). A stream that had opened ends with this as its terminal error event."""

    status, type, default_message = 502, "instance_failed", "the instance serving the request failed"


class UnknownInstance(PantheonError):
    """404 (the fleet's router): a heartbeat from an instance the registry does not hold (never registered, or
    dropped after missing heartbeats); the instance registers again."""

    status, type, default_message = 404, "unknown_instance", "this instance is not registered"


class ServerError(PantheonError):
    """500: the generation failed (worker died, out of memory, an engine error)."""

    status, type, default_message = 500, "server_error", "generation failed"


class LoadFailed(PantheonError):
    """POST /admin/models/load refused or failed; the status tells which (400, 404, 409, 507, 500)."""

    type, default_message = "load_failed", "load failed"

    def __init__(self, message: str | None = None, *, status: int = 500, **kwargs):
        self.status = status
        super().__init__(message, **kwargs)


class UnloadFailed(PantheonError):
    """POST /admin/models/unload refused or failed; the status tells which (404, 409, 500)."""

    type, default_message = "unload_failed", "unload failed"

    def __init__(self, message: str | None = None, *, status: int = 500, **kwargs):
        self.status = status
        super().__init__(message, **kwargs)


class Unauthorized(PantheonError):
    """401: a token is required and the request has none, or one that is unknown, revoked or expired."""

    status, type, default_message = 401, "unauthorized", "a valid bearer token is required"

    def default_headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(PantheonError):
    """403: a valid token whose role may not call this route."""

    status, type, default_message = 403, "forbidden", "this token's role may not call this route"


class ManagementError(PantheonError):
    """An error of the management API (/api/weights/*): the spec's `code` (NOT_ATTACHED, WEIGHTS_TORN, ...), its
    `reason` when the spec names one, and `details`; rendered in the management envelope."""

    type = "management_error"

    def __init__(self, code: str, message: str, *, status: int, reason: str = "", details: dict | None = None,
                 headers: dict[str, str] | None = None):  # fmt: skip
        self.code, self.status, self.details = code, status, dict(details or {})
        super().__init__(message, reason=reason, headers=headers)

    @property
    def audit_type(self) -> str:
        """The spec's code: a management refusal is audited by its code, as the client reads it."""
        return self.code


def management_error_body(exc: ManagementError) -> dict:
    error = {"code": exc.code, "message": exc.message, "reason": exc.reason or None, "details": exc.details}
    return {"success": False, "data": None, "error": error}


def openai_error_body(exc: PantheonError, *, streaming: bool = False) -> dict:
    """The OpenAI envelope; `streaming` adds the fields a terminal SSE error event carries (kv_used, kv_cap)."""
    error = {"message": exc.message, "type": exc.type, "code": exc.code}
    if exc.param is not None:
        error["param"] = exc.param
    if streaming:
        error.update(exc.stream_fields())
    return {"error": error}


def error_response(exc: PantheonError) -> JsonResponse:
    """The one renderer of an error as an HTTP response: status, envelope, headers."""
    body = management_error_body(exc) if isinstance(exc, ManagementError) else openai_error_body(exc)
    response = JsonResponse(body, status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


UI_PREFIX = "/ui/"


def render_error(request, exc: PantheonError):
    """`error_response`, except under /ui/, where a person reads it: the UI's error page with the same status and
    headers."""
    if not request.path.startswith(UI_PREFIX):
        return error_response(exc)
    from django.shortcuts import render

    context = {"status": exc.status, "error_type": exc.type, "message": exc.message, "notices": []}
    response = render(request, "admin_ui/error.html", context, status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


# SQLSTATE classes of a server that is gone or going: 08 connection exception, 57P01-57P03 admin or crash shutdown,
# cannot connect now (PostgreSQL's table of error codes).
_UNAVAILABLE_SQLSTATES = ("08", "57P01", "57P02", "57P03")


def database_unavailable(exc: BaseException) -> ServiceUnavailable | None:
    """The 503 for an error that says the database cannot be reached; None for any other (a query's own error stays
    a bug, a 500). InterfaceError is a connection already closed; an OperationalError counts when the driver's error
    beneath it carries no SQLSTATE (the connection failed before the server answered) or one of a server that is gone.
    """
    if isinstance(exc, InterfaceError):
        return _database_down()
    if not isinstance(exc, OperationalError):
        return None
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", "")
    if cause is None or cause.__class__.__module__.startswith("sqlite3"):
        return None
    if sqlstate is None or sqlstate.startswith(_UNAVAILABLE_SQLSTATES):
        return _database_down()
    return None


def _database_down() -> ServiceUnavailable:
    return ServiceUnavailable(
        "the database is unavailable; retry shortly",
        reason="database_unavailable",
        retry_after=settings.PANTHEON_RETRY_AFTER_UNAVAILABLE_S,
    )


def as_pantheon_error(exc: Exception) -> PantheonError | None:
    """Map DRF's own exceptions (parse errors, validation errors, ...) and an unreachable database to the spec's
    types; None for anything else."""
    if isinstance(exc, PantheonError):
        return exc
    if (unavailable := database_unavailable(exc)) is not None:
        return unavailable
    if isinstance(exc, drf.MethodNotAllowed | drf.NotFound):
        return NotFound()
    if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
        return Unauthorized(reason="token_missing")
    if isinstance(exc, drf.PermissionDenied):
        return Forbidden(reason="role")
    if isinstance(exc, drf.ValidationError):
        return InvalidRequest(_validation_message(exc.detail), reason="validation")
    if isinstance(exc, drf.APIException) and exc.status_code < 500:
        return InvalidRequest(str(exc.detail), reason=exc.default_code)
    return None


def _validation_message(detail, path: str = "") -> str:
    """Flatten DRF's nested validation detail into one readable line: `messages.0.role: "x" is not a valid choice.`"""
    if isinstance(detail, dict):
        return "; ".join(_validation_message(v, f"{path}.{k}" if path else str(k)) for k, v in detail.items())
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            text = " ".join(str(item) for item in detail)
            return f"{path}: {text}" if path else text
        return "; ".join(_validation_message(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(detail) if v)
    return f"{path}: {detail}" if path else str(detail)


def drf_exception_handler(exc: Exception, context: dict):
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every error a DRF view raises leaves in the spec's envelope."""
    if (unavailable := database_unavailable(exc)) is not None:
        return unavailable_response(context["request"], unavailable, exc)
    error = as_pantheon_error(exc)
    return error_response(error) if error is not None else None


def unavailable_response(request, error: ServiceUnavailable, cause: BaseException):
    """The 503 of a route that could not reach the database, in the route's envelope (the management one under
    /api/weights/, the UI's page under /ui/), logged as one line naming the route and the driver's message; Django's
    own request log (which would add the traceback) is told it has been logged."""
    detail = str(cause.__cause__ or cause).strip().splitlines()
    logger.warning(
        "database unavailable: %s %s answered 503 (%s: %s)",
        request.method,
        request.path,
        type(cause).__name__,
        detail[0] if detail else "no message",
    )
    if request.path.startswith(MANAGEMENT_PREFIX):
        response = error_response(
            ManagementError(
                "SERVICE_UNAVAILABLE", error.message, status=503, reason=error.reason, headers=error.headers
            )  # fmt: skip
        )
    else:
        if request.path.startswith(UI_PREFIX):
            from django.contrib.auth.models import AnonymousUser

            request.user = AnonymousUser()  # who is signed in is in the database too: the page names no one
        response = render_error(request, error)
    response._has_been_logged = True
    return response


def handler400(request, exception=None):
    """Django's own 400s (e.g. a body over DATA_UPLOAD_MAX_MEMORY_SIZE) in the envelope."""
    return render_error(request, InvalidRequest(str(exception) if exception else None, reason="bad_request"))


def handler403(request, exception=None):
    return render_error(request, Forbidden())


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: a UI form posted without a valid CSRF token is refused with 403, and changes nothing."""
    return render_error(request, Forbidden("the form was refused: its CSRF token is missing or wrong; reload the page"))


MANAGEMENT_PREFIX = "/api/weights/"


def handler404(request, exception=None):
    """Any path no route matches: 404 not_found "unknown route" (in the management envelope under /api/weights/)."""
    if request.path.startswith(MANAGEMENT_PREFIX):
        return error_response(ManagementError("NOT_FOUND", "unknown route", status=404))
    return render_error(request, NotFound())


def handler500(request):
    """An exception no view mapped: 500, in the envelope of the route's family (the management one under
    /api/weights/, where a trainer's client reads `success` and `error.code`); 503 when it says the database cannot
    be reached (raised in a middleware, e.g. the UI's session and user, which no view hook sees). Django calls this
    while the exception is being handled, so sys.exc_info() holds it."""
    exc = sys.exc_info()[1]
    if exc is not None and (unavailable := database_unavailable(exc)) is not None:
        return unavailable_response(request, unavailable, exc)
    if request.path.startswith(MANAGEMENT_PREFIX):
        return error_response(ManagementError("INTERNAL", "internal server error", status=500))
    return render_error(request, ServerError("internal server error"))
