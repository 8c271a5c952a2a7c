"""The batch write paths shared by the API, manage.py and the UI: who may see a batch, and cancelling one.

A viewer is the access token a call presents (`None`: client tokens are off, or the UI's staff user): an operator
token or `None` sees every batch and file, any other token only its own (`owner`). A batch the viewer may not see is
reported as not found, never as forbidden, so ids are not probed.
"""

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from batches.models import CANCELLABLE_STATUSES, Batch, BatchStatus, StoredFile
from pantheon_site.errors import InvalidRequest, NotFound
from pantheon_site.models import AccessToken, Role


def is_storable_text(text: str) -> bool:
    """Whether the database can hold (or look up) `text`: PostgreSQL's text takes no NUL character, and UTF-8 no lone
    surrogate (which JSON's \\ud800 escape makes). A client's id, name or custom_id that is not is refused, or is an
    id that names nothing, before it reaches a query."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def visible_to(queryset: QuerySet, viewer: AccessToken | None) -> QuerySet:
    """The rows of `queryset` (batches or files) that `viewer` may see."""
    if viewer is None or viewer.role == Role.OPERATOR:
        return queryset
    return queryset.filter(owner=viewer)


def _visible(model, row_id: str, viewer: AccessToken | None, noun: str):
    """The row of `model` with this id, if `viewer` may see it; raises NotFound (reason `<noun>_not_found`)
    otherwise, also for an id the database cannot hold."""
    row = visible_to(model.objects.all(), viewer).filter(pk=row_id).first() if is_storable_text(row_id) else None
    if row is None:
        raise NotFound(f"no {noun} {row_id!r}", reason=f"{noun}_not_found")
    return row


def visible_batch(batch_id: str, viewer: AccessToken | None) -> Batch:
    """The batch, if `viewer` may see it; raises NotFound otherwise."""
    return _visible(Batch, batch_id, viewer, "batch")


def visible_file(file_id: str, viewer: AccessToken | None) -> StoredFile:
    """The file, if `viewer` may see it; raises NotFound otherwise."""
    return _visible(StoredFile, file_id, viewer, "file")


def do_cancel_batch(batch_id: str, viewer: AccessToken | None) -> Batch:
    """Asks a batch to stop: validating or in_progress becomes cancelling (the batch's task lets the lines in flight
    finish, starts no other, writes the output and error files of what ran and ends `cancelled`); cancelling a
    cancelling or cancelled batch changes nothing (as OpenAI's). Raises NotFound for a batch the viewer cannot see
    and InvalidRequest for one that already ended otherwise (completed, failed, expired, finalizing)."""
    with transaction.atomic():
        visible_batch(batch_id, viewer)
        batch = Batch.objects.select_for_update().get(pk=batch_id)
        if batch.status in CANCELLABLE_STATUSES:
            batch.status, batch.cancelling_at = BatchStatus.CANCELLING, timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
        elif batch.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            raise InvalidRequest(f"batch {batch_id} is {batch.status} and cannot be cancelled", reason="batch_ended")
    return batch
