"""The batches app's periodic task on Celery beat (docs/periodic.md): expired files pruned."""

from celery import shared_task


@shared_task(name="batches.prune_expired_files", ignore_result=True)
def prune_expired_files() -> int:
    """Deletes the files past their expiry (row and content) that no active batch reads."""
    from batches.file_retention import prune_expired_files as prune

    return len(prune().deleted)
