"""The weights routes' errors: every code the spec names, and the HTTP status each one gets (the one table).

The worker's barrier names the code of a refusal (engine/weights/barrier.py); this table alone turns it into a
status. Codes the table does not know are a 500, so a new engine code cannot go out as a success.
"""

from __future__ import annotations

from django.conf import settings

from pantheon_site.errors import ManagementError
from weights.times import with_iso_times

STATUS = {
    "WEIGHTS_UNAUTHORIZED": 401,
    "WEIGHTS_FORBIDDEN": 403,
    "NOT_ATTACHMENT_HOLDER": 403,
    "NOT_ATTACHED": 409,
    "ALREADY_ATTACHED": 409,
    "ALREADY_QUIESCED": 409,
    "NOT_QUIESCED": 409,
    "NO_OPEN_COMMIT": 409,
    "WEIGHTS_NOT_CLEAN": 409,
    "PAUSE_IN_PROGRESS": 409,
    "BARRIER_UNAVAILABLE": 409,
    "MODEL_BUSY": 409,
    "ATTACHMENT_NOT_STALE": 409,
    "SHAPE_MISMATCH": 409,
    "CHECKPOINT_EXISTS": 409,
    "WEIGHTS_UNSAVED": 409,
    "MODEL_NOT_LOADED": 400,
    "NOT_ATTACHABLE": 400,
    "INVALID_REQUEST": 400,
    "CHECKPOINT_CORRUPT": 400,
    "CHECKPOINT_NOT_FOUND": 404,
    "NOT_FOUND": 404,
    "QUEUE_FULL": 503,
    "WEIGHTS_TORN": 503,
    "SAVE_FAILED": 500,
    "LOAD_FAILED": 500,
    "INTERNAL": 500,
}


def weights_error(
    code: str, message: str, *, reason: str | None = None, details: dict | None = None
) -> ManagementError:
    """The management-envelope error for `code`; 401 carries WWW-Authenticate, 503 a Retry-After."""
    headers = {}
    if code == "WEIGHTS_UNAUTHORIZED":
        headers["WWW-Authenticate"] = "Bearer"
    status = STATUS.get(code, 500)
    if status == 503:
        headers["Retry-After"] = str(max(1, round(settings.WEIGHTS_HOLD_TIMEOUT_S)))
    details = with_iso_times(details or {})
    return ManagementError(code, message, status=status, reason=reason or "", details=details, headers=headers)
