"""What is shown of a batch: OpenAI's batch object (what GET /v1/batches/{id} answers), and the operator UI's row
around it; and a page of them, newest first, for a viewer.

Both read the batch row alone (its counts are kept on it, updated with each recorded line), so a list costs one
query for its page however many lines its batches hold. A page is cut by keyset, as OpenAI's list is: `after` is the
id of the last batch of the previous page, and the next page starts below its (created_at, id), so no OFFSET reads
the rows before the page and a batch created meanwhile never shifts one into the next page twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q

from batches.models import ACTIVE_STATUSES, CANCELLABLE_STATUSES, Batch, BatchStatus
from batches.services import visible_to
from pantheon_site.errors import InvalidRequest
from pantheon_site.models import AccessToken

# The times of OpenAI's batch object, each null until the batch reaches that stage.
_STAGE_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
                "cancelled_at")  # fmt: skip


def _unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def batch_object(batch: Batch) -> dict[str, Any]:
    """OpenAI's batch object, with Pantheon's `waiting_reason` (why no line runs now; null while lines run)."""
    errors = {"object": "list", "data": batch.errors} if batch.errors else None
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _unix(batch.created_at),
        "expires_at": _unix(batch.expires_at),
        **{name: _unix(getattr(batch, name)) for name in _STAGE_TIMES},
        "request_counts": {
            "total": batch.total_count,
            "completed": batch.completed_count,
            "failed": batch.failed_count,
        },
        "metadata": batch.metadata,
        "waiting_reason": batch.waiting_reason or None,
    }


def progress_percent(batch: Batch) -> int:
    """How much of the batch has a recorded result, succeeded or failed, in whole percent (0 before its lines are
    counted)."""
    if batch.total_count == 0:
        return 0
    return (batch.completed_count + batch.failed_count) * 100 // batch.total_count


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch as the operator UI lists it: the batch object, its times as datetimes (for the page to format),
    the label of the token that created it, its progress and whether a cancel would stop it."""

    object: dict[str, Any]
    created_at: datetime
    expires_at: datetime
    owner: str
    progress: int
    cancellable: bool


def batch_row(batch: Batch) -> BatchRow:
    return BatchRow(
        object=batch_object(batch),
        created_at=batch.created_at,
        expires_at=batch.expires_at,
        owner=batch.owner.label if batch.owner_id else "",
        progress=progress_percent(batch),
        cancellable=batch.status in CANCELLABLE_STATUSES,
    )


@dataclass(frozen=True, slots=True)
class BatchPage:
    """A page of batches, newest first, and whether older ones follow (`rows[-1]`'s id is the next `after`)."""

    rows: list[BatchRow]
    has_more: bool


def batch_page(viewer: AccessToken | None, *, limit: int, after: str = "", status: str = "") -> BatchPage:
    """The batches `viewer` may see, newest first: at most `limit`, those after the batch `after` (its id), with
    status `status` when given. Raises InvalidRequest for a status OpenAI does not define or an `after` that names
    no batch the viewer sees."""
    batches = visible_to(Batch.objects.select_related("owner"), viewer)
    if status:
        if status not in BatchStatus.values:
            raise InvalidRequest(f"status: {status!r} is not a batch status", reason="bad_status")
        batches = batches.filter(status=status)
    if after:
        cursor = visible_to(Batch.objects.all(), viewer).filter(pk=after).values_list("created_at", flat=True).first()
        if cursor is None:
            raise InvalidRequest(f"after: no batch {after!r}", reason="bad_cursor")
        batches = batches.filter(Q(created_at__lt=cursor) | Q(created_at=cursor, id__lt=after))
    found = list(batches.order_by("-created_at", "-id")[: limit + 1])
    return BatchPage([batch_row(batch) for batch in found[:limit]], has_more=len(found) > limit)


def any_active(viewer: AccessToken | None) -> bool:
    """Whether a batch the viewer sees still has work in it (a page showing batches keeps itself fresh until none
    has)."""
    return visible_to(Batch.objects.filter(status__in=ACTIVE_STATUSES), viewer).exists()
