"""What the operator UI shows of a batch: its row around OpenAI's batch object (batches/wire.py, what GET
/v1/batches/{id} answers), and a page of them, newest first, for a viewer.

Both read the batch row alone (its counts are kept on it, updated with each recorded line), so a list costs one
query for its page however many lines its batches hold. A page is cut by keyset as the API's list is
(wire.page): `after` is the id of the last batch of the previous page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from batches.models import ACTIVE_STATUSES, CANCELLABLE_STATUSES, Batch, BatchStatus
from batches.services import visible_to
from batches.wire import batch_object, page
from pantheon_site.errors import InvalidRequest
from pantheon_site.models import AccessToken


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
    found, has_more = page(batches, after=after or None, limit=limit)
    return BatchPage([batch_row(batch) for batch in found], has_more=has_more)


def any_active(viewer: AccessToken | None) -> bool:
    """Whether a batch the viewer sees still has work in it (a page showing batches keeps itself fresh until none
    has)."""
    return visible_to(Batch.objects.filter(status__in=ACTIVE_STATUSES), viewer).exists()
