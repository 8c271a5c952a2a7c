"""What the Files and Batch routes answer: OpenAI's file and batch objects (as the `openai` package's FileObject and
Batch types read them, plus the batch's `waiting_reason`) and its cursor pages (`after` an id, `has_more`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from batches.models import Batch, StoredFile
from batches.services import is_storable_text
from pantheon_site.errors import InvalidRequest


def unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def file_object(stored: StoredFile) -> dict[str, Any]:
    """OpenAI's file object. `status` is always "processed" (OpenAI deprecated it; an upload is checked before it is
    stored, so every stored file is processed)."""
    return {
        "id": stored.id,
        "object": "file",
        "bytes": stored.bytes,
        "created_at": unix(stored.created_at),
        "expires_at": unix(stored.expires_at),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    """OpenAI's batch object, and `waiting_reason` (why no line runs now; null while lines run or the batch ended)."""
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": unix(batch.created_at),
        "in_progress_at": unix(batch.in_progress_at),
        "expires_at": unix(batch.expires_at),
        "finalizing_at": unix(batch.finalizing_at),
        "completed_at": unix(batch.completed_at),
        "failed_at": unix(batch.failed_at),
        "expired_at": unix(batch.expired_at),
        "cancelling_at": unix(batch.cancelling_at),
        "cancelled_at": unix(batch.cancelled_at),
        "request_counts": {
            "total": batch.total_count,
            "completed": batch.completed_count,
            "failed": batch.failed_count,
        },
        "metadata": batch.metadata,
        "waiting_reason": batch.waiting_reason or None,
    }


def page(rows: QuerySet, *, after: str | None, limit: int, ascending: bool = False) -> tuple[list, bool]:
    """Up to `limit` of `rows` (files or batches the caller may see) in creation order (newest first unless
    `ascending`), starting after the row whose id is `after`; and whether more follow. An `after` that names no row
    of `rows` is refused (param `after`)."""
    direction = "" if ascending else "-"
    ordered = rows.order_by(f"{direction}created_at", f"{direction}id")
    if after is not None:
        cursor = rows.filter(pk=after).values("created_at", "id").first() if is_storable_text(after) else None
        if cursor is None:
            raise InvalidRequest(f"after: no object has id {after!r:.80}", reason="page_cursor", param="after")
        later = "gt" if ascending else "lt"
        ordered = ordered.filter(
            Q(**{f"created_at__{later}": cursor["created_at"]})
            | Q(created_at=cursor["created_at"], **{f"id__{later}": cursor["id"]})
        )
    found = list(ordered[: limit + 1])
    return found[:limit], len(found) > limit


def list_body(objects: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object: the page's objects, its first and last ids, and whether more follow."""
    return {
        "object": "list",
        "data": objects,
        "first_id": objects[0]["id"] if objects else None,
        "last_id": objects[-1]["id"] if objects else None,
        "has_more": has_more,
    }
