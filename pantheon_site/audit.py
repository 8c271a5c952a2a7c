"""Writing the audit log: one AuditEvent row (and one `pantheon.audit` log line) per operator-visible action.

`AuditedCall` writes the one event of a call that runs (an operator route, a `manage.py` command, a load the
control plane starts itself): accepted, or refused with the error it raised. `audit_request` / `aaudit_request`
write the refused event of a route call turned away before it ran (`require_role`, pantheon_site/auth.py).
`record_audit_event` / `arecord_audit_event` are the general form (the supervisor's crash records).
`verify_audit_log` checks the hash chain (pantheon_site/audit_chain.py), from GENESIS or from the anchor a retention
prune recorded.
"""

from __future__ import annotations

import logging
import time

from inference.engine.contract.logs import request_id_var
from pantheon_site.audit_chain import ChainReport, verify_chain
from pantheon_site.errors import PantheonError, ServerError, as_pantheon_error
from pantheon_site.models import AccessToken, AuditChainHead, AuditEvent, Outcome

logger = logging.getLogger("pantheon.audit")


def _within(value: str, field: str) -> str:
    """`value` cut to the column's length: what a refused call was about may be anything a client sent (a load's
    path of any length), and the refusal must still be recorded (PostgreSQL refuses an over-long value)."""
    limit = AuditEvent._meta.get_field(field).max_length
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _fields(
    operation: str,
    outcome: str,
    *,
    actor_kind: str,
    actor_label: str = "",
    error: PantheonError | None = None,
    error_type: str = "",
    reason: str = "",
    model: str = "",
    request_id: str = "",
    client_address: str = "",
    duration_ms: float | None = None,
    details: dict | None = None,
) -> dict:
    if outcome not in Outcome.values:
        raise ValueError(f"outcome must be one of {Outcome.values}")
    # Inside an HTTP request (or work it started, such as a load on demand), the event is that request's.
    request_id = request_id or request_id_var.get() or ""
    details = dict(details or {})
    if error is not None:
        error_type = error_type or error.audit_type
        reason = reason or error.reason or error.message
        if reason != error.message:
            details.setdefault("message", error.message)
    return {
        "operation": operation,
        "outcome": outcome,
        "error_type": error_type,
        "reason": reason,
        "actor_kind": actor_kind,
        "actor_label": actor_label,
        "model": _within(model, "model"),
        "request_id": request_id,
        "client_address": client_address,
        "duration_ms": duration_ms,
        "details": details,
    }


def _log(event: AuditEvent) -> None:
    logger.info(
        "audit operation=%s outcome=%s error_type=%s reason=%r actor=%s:%s model=%r request_id=%s",
        event.operation,
        event.outcome,
        event.error_type or "-",
        event.reason,
        event.actor_kind,
        event.actor_label or "-",
        event.model,
        event.request_id or "-",
    )


def record_audit_event(operation: str, outcome: str, **fields) -> AuditEvent:
    """Append one event. Keyword fields: actor_kind (required: token, anonymous, cli, system), actor_label, error
    (a PantheonError: fills error_type and reason), error_type, reason, model, request_id (default: the current
    HTTP request's, pantheon_site/request_ids.py), client_address, duration_ms, details (a JSON-able dict)."""
    event = AuditEvent.objects.create(**_fields(operation, outcome, **fields))
    _log(event)
    return event


async def arecord_audit_event(operation: str, outcome: str, **fields) -> AuditEvent:
    """record_audit_event for async code."""
    event = await AuditEvent.objects.acreate(**_fields(operation, outcome, **fields))
    _log(event)
    return event


def event_as_dict(event: AuditEvent) -> dict:
    """An event as JSON-able fields (manage.py audit --json, the audit page's exports), with its place in the chain."""
    return {
        "id": event.id,
        "time": event.occurred_at.isoformat(),
        "operation": event.operation,
        "outcome": event.outcome,
        "error_type": event.error_type,
        "reason": event.reason,
        "actor_kind": event.actor_kind,
        "actor_label": event.actor_label,
        "model": event.model,
        "request_id": event.request_id,
        "client_address": event.client_address,
        "duration_ms": event.duration_ms,
        "details": event.details,
        "row_hash": event.row_hash,
    }


PRUNE_OPERATION = "audit_pruned"


def prune_anchors() -> frozenset[str]:
    """The hashes the log's own `audit_pruned` events recorded as where retention cut the chain. Read from the rows
    the walk then checks, so an anchor in an altered row is reported with that row."""
    anchors = AuditEvent.objects.filter(operation=PRUNE_OPERATION, outcome=Outcome.ACCEPTED)
    return frozenset(h for h in anchors.values_list("details__anchor_hash", flat=True) if isinstance(h, str))


def verify_audit_log() -> ChainReport:
    """Walk the whole log in the order it was written and report the first broken link (manage.py audit --verify,
    the audit page). The first row may link to an anchor a prune recorded (pantheon_site/audit_retention.py)."""
    head = AuditChainHead.objects.filter(pk=AuditChainHead.HEAD_ID).values_list("last_hash", flat=True).first()
    return verify_chain(AuditEvent.objects.order_by("id").iterator(chunk_size=5000), head, prune_anchors())


def request_actor(request, token: AccessToken | None = None) -> dict:
    """Who made a route call and from where, as an event's fields: the token's label (anonymous without one), the
    request id the middleware set, the client's address."""
    return {
        "actor_kind": "token" if token is not None else "anonymous",
        "actor_label": token.label if token is not None else "",
        "request_id": getattr(request, "request_id", ""),
        "client_address": request.META.get("REMOTE_ADDR", "") or "",
    }


def user_actor(request) -> dict:
    """A UI call's actor: the signed-in staff user (actor_kind "user"), with the request id and address, as
    request_actor gives a token's."""
    return {**request_actor(request), "actor_kind": "user", "actor_label": request.user.get_username()}


def audit_request(
    request, operation: str, *, error: PantheonError, token: AccessToken | None = None, started: float | None = None
) -> AuditEvent:
    """The refused event of a route call turned away before it ran (its token or credential; see
    pantheon_site/auth.py). `started` is a time.monotonic() taken when the call began, for the event's duration."""
    return record_audit_event(operation, Outcome.REFUSED, **_refusal_fields(request, error, token, started))


async def aaudit_request(
    request, operation: str, *, error: PantheonError, token: AccessToken | None = None, started: float | None = None
) -> AuditEvent:
    """audit_request for async views."""
    return await arecord_audit_event(operation, Outcome.REFUSED, **_refusal_fields(request, error, token, started))


def _refusal_fields(request, error: PantheonError, token: AccessToken | None, started: float | None) -> dict:
    duration_ms = (time.monotonic() - started) * 1000.0 if started is not None else None
    details = {"role": token.role} if token is not None else None  # a valid token of a role the route refuses
    return {**request_actor(request, token), "error": error, "duration_ms": duration_ms, "details": details}


def refusal_error(exc: Exception) -> PantheonError:
    """The error an audited call that raised `exc` was refused with: its PantheonError (DRF's exceptions mapped by
    as_pantheon_error), else a server_error whose reason names the exception's class."""
    return as_pantheon_error(exc) or ServerError(str(exc) or None, reason=type(exc).__name__)


class AuditedCall:
    """One call's audit event, written when the call ends: refused with `refusal_error` of what it raised, else
    accepted, either way with its duration from `started` (default: now). The one wrapper behind the operator
    routes, `manage.py` commands and the control plane's own loads: `with` in sync code, `async with` in async code.

    While the call runs it may say what it acted on (`model`, `details`), and set `audited_elsewhere` when another
    process audits it instead (the server a command forwarded the call to). A call without an operation (a
    read-only command) writes nothing, and neither does one that ends with a BaseException that is not an Exception
    (cancelled, interrupted): it was neither accepted nor refused.
    """

    def __init__(self, operation: str | None, *, model: str = "", started: float | None = None, **actor):
        self.operation = operation
        self.model = model
        self.details: dict | None = None
        self.audited_elsewhere = False
        self.started = time.monotonic() if started is None else started
        self._actor = actor  # actor_kind, actor_label, request_id, client_address

    def _event(self, exc: BaseException | None) -> tuple[str, dict] | None:
        """The outcome and fields of this call's event, or None when it writes none."""
        if self.operation is None or self.audited_elsewhere or (exc is not None and not isinstance(exc, Exception)):
            return None
        fields = {
            **self._actor,
            "model": self.model,
            "details": self.details,
            "duration_ms": (time.monotonic() - self.started) * 1000.0,
        }
        if exc is None:
            return Outcome.ACCEPTED, fields
        return Outcome.REFUSED, {**fields, "error": refusal_error(exc)}

    def __enter__(self) -> AuditedCall:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        event = self._event(exc)
        if event is not None:
            outcome, fields = event
            record_audit_event(self.operation, outcome, **fields)

    async def __aenter__(self) -> AuditedCall:
        return self

    async def __aexit__(self, exc_type, exc, traceback) -> None:
        event = self._event(exc)
        if event is not None:
            outcome, fields = event
            await arecord_audit_event(self.operation, outcome, **fields)
