"""Finding the batches no task runs: what `batches.resume_batches` and `batches.expire_batches` act on.

A batch's task can be lost without a trace: its worker killed, the machine restarted, or the broker lost the message
(Redis without persistence, or down when the batch was created). The database still says the batch is active, and
its lease says whether a task holds it, so a sweep over the active batches finds every batch that needs a task."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone

from batches.lease import lease_is_free
from batches.models import ACTIVE_STATUSES, Batch


def unrun_batches(now: datetime) -> list[str]:
    """Active batches whose lease is free or ran out at `now`: no task runs them."""
    return list(Batch.objects.filter(lease_is_free(now), status__in=ACTIVE_STATUSES).values_list("id", flat=True))


def held_batches(now: datetime) -> list[tuple[str, float]]:
    """Active batches whose lease is still held at `now`, with the seconds until it runs out: at a worker's start,
    these may be the batches of the worker it replaces. The same `now` as unrun_batches': a lease that runs out
    between the two queries is in one of them, never in neither."""
    held = Batch.objects.filter(status__in=ACTIVE_STATUSES).exclude(lease_is_free(now))
    return [(batch_id, (until - now).total_seconds()) for batch_id, until in held.values_list("id", "lease_until")]


def expired_unrun_batches() -> list[str]:
    """Active batches past their completion window that no task runs."""
    unrun = Batch.objects.filter(lease_is_free(), status__in=ACTIVE_STATUSES, expires_at__lte=timezone.now())
    return list(unrun.values_list("id", flat=True))
