"""Batches written straight into the database, as a batch's Celery task would have left them (no task runs)."""

from datetime import timedelta

from django.utils import timezone

from batches.models import Batch, FilePurpose, StoredFile


def stored_file(purpose: str = FilePurpose.BATCH, lines: int = 10) -> StoredFile:
    return StoredFile.objects.create(filename="requests.jsonl", purpose=purpose, bytes=100 * lines, line_count=lines)


def make_batch(status: str, total: int = 10, completed: int = 0, failed: int = 0, age_s: float = 0, **fields) -> Batch:
    """A batch of `total` lines, `completed` and `failed` of them recorded, created `age_s` seconds ago (or at
    `created_at`)."""
    created = fields.pop("created_at", None) or timezone.now() - timedelta(seconds=age_s)
    return Batch.objects.create(
        endpoint="/v1/chat/completions",
        status=status,
        input_file=fields.pop("input_file", None) or stored_file(lines=total),
        total_count=total,
        completed_count=completed,
        failed_count=failed,
        created_at=created,
        expires_at=created + timedelta(hours=24),
        **fields,
    )
