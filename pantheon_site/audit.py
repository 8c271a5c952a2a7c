"""Writing the audit log: one AuditEvent row (and one `pantheon.audit` log line) per operator-visible action.

`audit_request` / `aaudit_request` are what an operator route calls, exactly once per call, with the error it is
answering with (if any); `require_role` (pantheon_site/auth.py) already audits the refusals it raises.
`record_audit_event` / `arecord_audit_event` are the general form (commands, the supervisor's crash records).
"""

import logging
import time

from pantheon_site.errors import PantheonError
from pantheon_site.models import AccessToken, AuditEvent, Outcome

logger = logging.getLogger("pantheon.audit")


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
    details = dict(details or {})
    if error is not None:
        error_type = error_type or error.type
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
        "model": model,
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
    (a PantheonError: fills error_type and reason), error_type, reason, model, request_id, client_address,
    duration_ms, details (a JSON-able dict)."""
    event = AuditEvent.objects.create(**_fields(operation, outcome, **fields))
    _log(event)
    return event


async def arecord_audit_event(operation: str, outcome: str, **fields) -> AuditEvent:
    """record_audit_event for async code."""
    event = await AuditEvent.objects.acreate(**_fields(operation, outcome, **fields))
    _log(event)
    return event


def _request_event(request, token, error, started, model, details) -> tuple[str, dict]:
    """The outcome and fields of a route call's event: refused when `error` is given, else accepted."""
    outcome = Outcome.REFUSED if error is not None else Outcome.ACCEPTED
    return outcome, {"model": model, "details": details, **_request_fields(request, token, error, started)}


def _request_fields(request, token: AccessToken | None, error: PantheonError | None, started: float | None) -> dict:
    return {
        "actor_kind": "token" if token is not None else "anonymous",
        "actor_label": token.label if token is not None else "",
        "error": error,
        "request_id": getattr(request, "request_id", ""),
        "client_address": request.META.get("REMOTE_ADDR", "") or "",
        "duration_ms": (time.monotonic() - started) * 1000.0 if started is not None else None,
    }


def audit_request(
    request,
    operation: str,
    *,
    token: AccessToken | None = None,
    error: PantheonError | None = None,
    model: str = "",
    started: float | None = None,
    details: dict | None = None,
) -> AuditEvent:
    """The audit event of one route call: refused when `error` is given, else accepted.

    `started` is a time.monotonic() taken when the call began; the event then records its duration.
    """
    outcome, fields = _request_event(request, token, error, started, model, details)
    return record_audit_event(operation, outcome, **fields)


async def aaudit_request(
    request,
    operation: str,
    *,
    token: AccessToken | None = None,
    error: PantheonError | None = None,
    model: str = "",
    started: float | None = None,
    details: dict | None = None,
) -> AuditEvent:
    """audit_request for async views."""
    outcome, fields = _request_event(request, token, error, started, model, details)
    return await arecord_audit_event(operation, outcome, **fields)
