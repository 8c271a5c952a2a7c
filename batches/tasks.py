"""The batch's Celery tasks: one per batch (run_batch), and the periodic sweep that starts a batch whose task is gone.

The work is in batches/runner.py; a task here only names it for Celery."""

from celery import shared_task


@shared_task(name="batches.run_batch", ignore_result=True)
def run_batch(batch_id: str) -> None:
    """Runs a batch to its end (or until its lease is lost); a batch that is gone or already ended is a no-op."""
    from batches.runner import run_batch as run  # runner imports the ORM: only once the apps are ready

    run(batch_id)
