"""The batch's Celery tasks: one per batch (run_batch), the sweep that starts a batch whose task is gone
(resume_batches, on beat and when a worker starts) and the one that ends batches past their window
(expire_batches, on beat).

The work is in batches/runner.py and batches/sweep.py; a task here only names it for Celery."""

import logging

from celery import shared_task
from celery.signals import worker_ready

logger = logging.getLogger("pantheon.batches")


@shared_task(name="batches.run_batch", ignore_result=True)
def run_batch(batch_id: str) -> None:
    """Runs a batch to its end (or until its lease is lost); a batch that is gone, ended or held is a no-op."""
    from batches.runner import run_batch as run  # runner imports the ORM: only once the apps are ready

    run(batch_id)


@shared_task(name="batches.resume_batches", ignore_result=True)
def resume_batches(at_worker_start: bool = False) -> None:
    """Sends run_batch for every active batch no task runs. At a worker's start also for the batches still held,
    each once its lease runs out: the worker that held them may be the one this worker replaces (if it lives, its
    renewed lease makes that run_batch a no-op)."""
    from django.utils import timezone

    from batches.sweep import held_batches, unrun_batches

    now = timezone.now()
    unrun, held = unrun_batches(now), held_batches(now) if at_worker_start else []
    if unrun or held:
        logger.info("resuming batches: %s now, %s when their lease runs out", unrun, [b for b, _ in held])
    for batch_id in unrun:
        run_batch.delay(batch_id)
    for batch_id, seconds_left in held:
        run_batch.apply_async((batch_id,), countdown=max(0.0, seconds_left) + 1.0)


@shared_task(name="batches.expire_batches", ignore_result=True)
def expire_batches() -> None:
    """Ends every batch past its completion window that no task runs, here: the lines not run are reported as
    batch_expired, the files written, the batch expired (runner.run_batch sends nothing past the window)."""
    from batches.runner import run_batch as run
    from batches.sweep import expired_unrun_batches

    for batch_id in expired_unrun_batches():
        run(batch_id)


@worker_ready.connect
def _resume_at_worker_start(sender=None, **kwargs) -> None:
    """A worker that starts (after a crash, a deploy, a machine restart) resumes the batches left without a task."""
    resume_batches.apply_async(kwargs={"at_worker_start": True})
