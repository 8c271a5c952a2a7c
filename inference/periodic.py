"""The serving control plane's periodic task on Celery beat (docs/periodic.md): worker rows a dead serve left."""

from celery import shared_task


@shared_task(name="inference.mark_stale_workers", ignore_result=True)
def mark_stale_workers() -> int:
    """Marks dead the workers no running serve has vouched for in PANTHEON_WORKER_STALE_AFTER_S."""
    from inference.services.stale_workers import mark_stale_workers as mark

    return len(mark())
