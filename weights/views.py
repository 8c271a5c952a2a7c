"""The /api/weights routes (spec: "Weights: attachment and the step barrier" and checkpoints), in the management
envelope `{"success", "data", "error"}`.

A gated call checks its token first (401 WEIGHTS_UNAUTHORIZED with WWW-Authenticate: Bearer, then 403
WEIGHTS_FORBIDDEN for a role the route does not admit) and then runs as one call of weights/services.py; either way
it writes one audit event with the spec's fields. GET /status, /lineage and /checkpoints take no token. Neither the
token nor the attachment id is ever logged, audited or returned (the id once, by attach).
"""

from __future__ import annotations

import json
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from inference.engine.contract.weights import WeightsCode, WeightsOperation
from inference.runtime.router import get_router
from pantheon_site.audit import arecord_audit_event
from pantheon_site.auth import bearer_secret
from pantheon_site.errors import ManagementError, NoModelsLoaded, PantheonError, Unauthorized
from pantheon_site.methods import only
from pantheon_site.models import Outcome, Role
from pantheon_site.tokens import aauthenticate_token
from weights import services
from weights.errors import weights_error
from weights.model_choice import call_placement, named_placement, requested_model
from weights.models import Checkpoint
from weights.status import model_status, status_overview
from weights.times import with_iso_times

ATTACHMENT_HEADER = "X-miLLM-Attachment"
HOLDER_ROLES = (Role.TRAINER, Role.OPERATOR)
# The audit operation of each call; a token refusal on save and load logs weights_save / weights_load.
AUDIT_OPERATION = {op: "weights_" + op.value.replace("-", "_") for op in WeightsOperation} | {
    WeightsOperation.SAVE: "save",
    WeightsOperation.LOAD: "load",
}


def envelope(data: Any) -> JsonResponse:
    return JsonResponse({"success": True, "data": with_iso_times(data), "error": None})


def _body(request) -> dict[str, Any]:
    if not request.body.strip():
        return {}
    try:
        body = json.loads(request.body)
    except ValueError:
        raise weights_error(WeightsCode.INVALID_REQUEST, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise weights_error(WeightsCode.INVALID_REQUEST, "the body must be a JSON object")
    return body


async def _token(request):
    try:
        return await aauthenticate_token(bearer_secret(request))
    except Unauthorized as exc:
        raise weights_error(
            WeightsCode.WEIGHTS_UNAUTHORIZED, "a valid trainer or operator token is required", reason=exc.reason
        ) from None


def _check_role(token, roles: tuple[str, ...]) -> None:
    if token.role not in roles:
        raise weights_error(
            WeightsCode.WEIGHTS_FORBIDDEN, f"a {token.role} token may not call this route", reason=f"role_{token.role}"
        )


async def gated(request, operation: WeightsOperation, roles: tuple[str, ...] = HOLDER_ROLES) -> JsonResponse:
    """Runs one gated call and writes its audit event, accepted or refused."""
    started = time.monotonic()
    record = services.CallRecord()
    token = None
    try:
        token = await _token(request)
        _check_role(token, roles)
        body = _body(request)
        model = requested_model(body.get("model"), request.GET.get("model"))
        attachment_id = request.headers.get(ATTACHMENT_HEADER) or None
        data = await services.call_barrier(
            get_router(),
            operation,
            role=token.role,
            label=token.label,
            attachment_id=attachment_id,
            body=body,
            model=model,
            record=record,
        )
    except PantheonError as error:
        if not isinstance(error, ManagementError):
            error = weights_error(
                WeightsCode.MODEL_NOT_LOADED if isinstance(error, NoModelsLoaded) else WeightsCode.INTERNAL,
                error.message,
            )
        token_refused = error.code in (WeightsCode.WEIGHTS_UNAUTHORIZED, WeightsCode.WEIGHTS_FORBIDDEN)
        name = "weights_" + operation.value.replace("-", "_") if token_refused else AUDIT_OPERATION[operation]
        await _audit(name, request, token, record, started, error)
        raise error from None
    await _audit(AUDIT_OPERATION[operation], request, token, record, started, None)
    return envelope(data)


async def _audit(operation, request, token, record, started, error: ManagementError | None) -> None:
    details = {
        "role": token.role if token is not None else None,
        "attachment": record.attachment or None,
        "weights_state_before": record.state_before,
        "weights_state": record.state_after,
        **record.extra,
    }
    fields: dict[str, Any] = {
        "actor_kind": "token" if token is not None else "anonymous",
        "actor_label": token.label if token is not None else "",
        "model": record.model,
        "request_id": getattr(request, "request_id", ""),
        "client_address": request.META.get("REMOTE_ADDR", "") or "",
        "duration_ms": (time.monotonic() - started) * 1000.0,
        "details": details,
    }
    if error is not None:
        details["code"] = error.code
        fields |= {"error_type": error.code, "reason": error.reason or error.message}
    await arecord_audit_event(operation, Outcome.REFUSED if error else Outcome.ACCEPTED, **fields)


def _holder_route(operation: WeightsOperation, roles: tuple[str, ...] = HOLDER_ROLES):
    @only("POST")
    async def view(request):
        return await gated(request, operation, roles)

    view.__name__ = operation.value.replace("-", "_")
    return view


attach = _holder_route(WeightsOperation.ATTACH)
detach = _holder_route(WeightsOperation.DETACH)
heartbeat = _holder_route(WeightsOperation.HEARTBEAT)
quiesce = _holder_route(WeightsOperation.QUIESCE)
resume = _holder_route(WeightsOperation.RESUME)
commit_begin = _holder_route(WeightsOperation.COMMIT_BEGIN)
commit_end = _holder_route(WeightsOperation.COMMIT_END)
clear_stale = _holder_route(WeightsOperation.CLEAR_STALE, (Role.OPERATOR,))
save = _holder_route(WeightsOperation.SAVE)
load = _holder_route(WeightsOperation.LOAD)


@only("GET")
async def status(request):
    """Anyone, no token, no slot: the named model's barrier; without a name, the default's (weights/model_choice.py)
    and every served model's in `models`."""
    router = get_router()
    model = requested_model(None, request.GET.get("model"))
    if model:
        return envelope(await sync_to_async(model_status)(router, named_placement(router, model)))
    return envelope(await sync_to_async(status_overview)(router))


@only("GET")
async def lineage(request):
    """The parent chain of the served weights (the named model's, else the default's), back to the base model."""
    placement = call_placement(get_router(), requested_model(None, request.GET.get("model")))
    return envelope({"chain": await sync_to_async(services.lineage)(placement.weights)})


@only("GET")
async def checkpoints(request):
    """Every checkpoint saved, oldest first."""

    def rows() -> list[dict[str, Any]]:
        return [services.checkpoint_row(c) for c in Checkpoint.objects.select_related("parent")]

    return envelope({"checkpoints": await sync_to_async(rows)()})
