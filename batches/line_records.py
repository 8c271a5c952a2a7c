"""A line's records in the database: the attempt counted before each send, and its result recorded exactly once.

Both are conditional UPDATEs on `state = pending`, so a line whose result is recorded is never sent again and never
recorded twice, whichever task (or two tasks, after a lease was lost) tries. The batch's request counts move in the
transaction that records the line, so they always equal the recorded lines. The result is OpenAI's output line:
`{id, custom_id, response: {status_code, request_id, headers: {X-miLLM-Model}, body}, error}` for an answer, or
`{..., response: null, error: {code, message}}` for a line that got no answer that could be recorded."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from batches.models import Batch, BatchLine, LineState

MILLM_MODEL_HEADER = "X-miLLM-Model"


def answer_line(custom_id: str, status: int, request_id: str, model: str | None, body: Any) -> dict:
    """The output line of a line the server answered (any status: a non-2xx one goes to the error file as is)."""
    return {
        "id": "batch_req_" + secrets.token_hex(12),
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": request_id,
            "headers": {MILLM_MODEL_HEADER: model},
            "body": body,
        },
        "error": None,
    }


def error_line(custom_id: str, code: str, message: str) -> dict:
    """The output line of a line that got no answer: a bad line, or one the batch's expiry left unsent."""
    return {"id": "batch_req_" + secrets.token_hex(12), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}  # fmt: skip


def count_attempt(line_id: int) -> bool:
    """Counts one more send of a pending line; False when the line is recorded already (it must not be sent)."""
    pending = BatchLine.objects.filter(pk=line_id, state=LineState.PENDING)
    return pending.update(attempts=F("attempts") + 1) == 1


def record_line(batch_id: str, line_id: int, result: dict, succeeded: bool) -> bool:
    """Records a pending line's result and counts it on the batch, in one transaction; False (and nothing changes)
    when the line was recorded already."""
    state, counter = (LineState.SUCCEEDED, "completed_count") if succeeded else (LineState.FAILED, "failed_count")
    with transaction.atomic():
        moved = BatchLine.objects.filter(pk=line_id, state=LineState.PENDING).update(
            state=state, result=result, recorded_at=timezone.now()
        )
        if moved == 1:
            Batch.objects.filter(pk=batch_id).update(**{counter: F(counter) + 1})
    return moved == 1
