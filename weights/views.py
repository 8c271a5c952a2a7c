"""The /api/weights routes (spec: "Weights: attachment and the step barrier" and checkpoints), in the management
envelope `{"success", "data", "error"}`.

A gated call checks its token first, with the shared check of every token route (pantheon_site/auth.py; here 401
WEIGHTS_UNAUTHORIZED with WWW-Authenticate: Bearer, then 403 WEIGHTS_FORBIDDEN for a role the route does not
admit), and then runs as one call of weights/services.py inside the shared AuditedCall; either way it writes one
audit event with the spec's fields. GET /status, /lineage and /checkpoints take no token. Neither the
token nor the attachment id is ever audited or returned (the id once, by attach); the token is never logged, the
attachment id only with PANTHEON_LOG_SENSITIVE, a debug setting (docs/logging.md).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse

from inference.engine.contract.weights import WeightsCode, WeightsOperation
from inference.runtime.router import get_router
from pantheon_site.audit import AuditedCall, request_actor
from pantheon_site.auth import arequire_role
from pantheon_site.errors import Forbidden, ManagementError, NoModelsLoaded, PantheonError, RateLimited
from pantheon_site.methods import only
from pantheon_site.models import Role
from weights import services
from weights.errors import weights_error
from weights.model_choice import call_placement, named_placement, requested_model
from weights.models import Checkpoint
from weights.status import model_status, status_overview
from weights.times import with_iso_times

ATTACHMENT_HEADER = "X-miLLM-Attachment"
HOLDER_ROLES = (Role.TRAINER, Role.OPERATOR)
# The audit operation of each call, and of its token refusal (they differ for save and load only).
TOKEN_OPERATION = {op: "weights_" + op.value.replace("-", "_") for op in WeightsOperation}
AUDIT_OPERATION = TOKEN_OPERATION | {WeightsOperation.SAVE: "save", WeightsOperation.LOAD: "load"}

logger = logging.getLogger("pantheon.weights")


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


def _token_refusal(error: PantheonError) -> ManagementError:
    """The shared token check's refusal in the weights envelope (pantheon_site/auth.py arequire_role)."""
    if isinstance(error, Forbidden):
        return weights_error(WeightsCode.WEIGHTS_FORBIDDEN, error.message, reason=error.reason)
    if isinstance(error, RateLimited):
        return weights_error(WeightsCode.RATE_LIMITED, error.message, reason=error.reason, headers=error.headers)
    message = "a valid trainer or operator token is required"
    return weights_error(WeightsCode.WEIGHTS_UNAUTHORIZED, message, reason=error.reason)


def _as_weights_error(error: PantheonError) -> ManagementError:
    if isinstance(error, ManagementError):
        return error
    code = WeightsCode.MODEL_NOT_LOADED if isinstance(error, NoModelsLoaded) else WeightsCode.INTERNAL
    return weights_error(code, error.message)


async def gated(request, operation: WeightsOperation, roles: tuple[str, ...] = HOLDER_ROLES) -> JsonResponse:
    """Runs one gated call as one audited call (pantheon_site/audit.py AuditedCall), accepted or refused; a token
    refusal is audited by the shared token check under `weights_<operation>`."""
    started = time.monotonic()
    token_operation = TOKEN_OPERATION[operation]
    token = await arequire_role(request, *roles, operation=token_operation, as_error=_token_refusal, started=started)
    record = services.CallRecord()
    actor = request_actor(request, token)
    attachment_id = request.headers.get(ATTACHMENT_HEADER) or None
    if settings.PANTHEON_LOG_SENSITIVE and attachment_id:
        logger.info("weights %s by %r with attachment %s", operation.value, token.label, attachment_id)
    async with AuditedCall(AUDIT_OPERATION[operation], started=started, **actor) as audit:
        try:
            body = _body(request)
            data = await services.call_barrier(
                get_router(),
                operation,
                role=token.role,
                label=token.label,
                attachment_id=attachment_id,
                body=body,
                model=requested_model(body.get("model"), request.GET.get("model")),
                record=record,
            )
        except PantheonError as error:
            refusal = _as_weights_error(error)
            record.extra["code"] = refusal.code
            raise refusal from None
        finally:
            audit.model, audit.details = record.model, record.audit_details(token.role)
    return envelope(data)


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
