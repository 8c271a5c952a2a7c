"""The weights routes' errors: the HTTP status of every code the spec names (the one table).

The codes themselves are one enum, `WeightsCode` (inference/engine/contract/weights.py), which the worker's barrier
and the control plane's own checks both raise; this table alone turns a code into a status, and every code has one
(tests/weights/test_weights_codes.py), so no refusal goes out as an unplanned 500.
"""

from __future__ import annotations

from django.conf import settings

from inference.engine.contract.weights import WeightsCode
from pantheon_site.errors import ManagementError
from weights.times import with_iso_times

STATUS: dict[WeightsCode, int] = {
    WeightsCode.WEIGHTS_UNAUTHORIZED: 401,
    WeightsCode.WEIGHTS_FORBIDDEN: 403,
    WeightsCode.RATE_LIMITED: 429,
    WeightsCode.NOT_ATTACHMENT_HOLDER: 403,
    WeightsCode.NOT_ATTACHED: 409,
    WeightsCode.ALREADY_ATTACHED: 409,
    WeightsCode.ALREADY_QUIESCED: 409,
    WeightsCode.NOT_QUIESCED: 409,
    WeightsCode.NO_OPEN_COMMIT: 409,
    WeightsCode.WEIGHTS_NOT_CLEAN: 409,
    WeightsCode.PAUSE_IN_PROGRESS: 409,
    WeightsCode.BARRIER_UNAVAILABLE: 409,
    WeightsCode.MODEL_BUSY: 409,
    WeightsCode.ATTACHMENT_NOT_STALE: 409,
    WeightsCode.SHAPE_MISMATCH: 409,
    WeightsCode.CHECKPOINT_EXISTS: 409,
    WeightsCode.WEIGHTS_UNSAVED: 409,
    WeightsCode.MODEL_NOT_LOADED: 400,
    WeightsCode.NOT_ATTACHABLE: 400,
    WeightsCode.INVALID_REQUEST: 400,
    WeightsCode.CHECKPOINT_CORRUPT: 400,
    WeightsCode.CHECKPOINT_NOT_FOUND: 404,
    WeightsCode.NOT_FOUND: 404,
    WeightsCode.QUEUE_FULL: 503,
    WeightsCode.WEIGHTS_TORN: 503,
    WeightsCode.SAVE_FAILED: 500,
    WeightsCode.LOAD_FAILED: 500,
    WeightsCode.INTERNAL: 500,
    WeightsCode.SERVICE_UNAVAILABLE: 503,
}


def weights_error(
    code: WeightsCode,
    message: str,
    *,
    reason: str | None = None,
    details: dict | None = None,
    headers: dict[str, str] | None = None,
) -> ManagementError:
    """The management-envelope error for `code`; 401 carries WWW-Authenticate, 503 a Retry-After, and `headers` go
    on as given (a rate limit's Retry-After). A `code` that is not a WeightsCode is a ValueError: a new code needs its
    status here first."""
    code = WeightsCode(code)
    headers = dict(headers or {})
    if code is WeightsCode.WEIGHTS_UNAUTHORIZED:
        headers["WWW-Authenticate"] = "Bearer"
    status = STATUS[code]
    if status == 503:
        headers["Retry-After"] = str(max(1, round(settings.WEIGHTS_HOLD_TIMEOUT_S)))
    details = with_iso_times(details or {})
    return ManagementError(code, message, status=status, reason=reason or "", details=details, headers=headers)
