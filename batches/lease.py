"""A batch's lease: the one Celery task that runs a batch holds it, renews it while it runs, and loses it if it stops
renewing (its worker died). Every step is one conditional UPDATE on the batch row, so two tasks never both believe
they hold it: a second task for a running batch finds the lease taken and does nothing, and the batch of a dead task
is taken over once its `lease_until` has passed (docs/batches.md)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from batches.models import ACTIVE_STATUSES, Batch


def new_lease_owner() -> str:
    """Who holds a lease: the host and process (for an operator reading the row) and a per-task random part."""
    return f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _until():
    return timezone.now() + timedelta(seconds=settings.PANTHEON_BATCH_LEASE_S)


def lease_is_free(now: datetime | None = None) -> Q:
    """Batches whose lease nobody holds at `now` (default: now): never taken, released, or run out."""
    return Q(lease_owner="") | Q(lease_until__isnull=True) | Q(lease_until__lt=now or timezone.now())


def take_lease(batch_id: str, owner: str) -> bool:
    """Takes the lease of an active batch whose lease is free; False if the batch is gone, ended or held."""
    taken = Batch.objects.filter(lease_is_free(), pk=batch_id, status__in=ACTIVE_STATUSES)
    return taken.update(lease_owner=owner, lease_until=_until()) == 1


def renew_lease(batch_id: str, owner: str) -> bool:
    """Extends the lease `owner` holds; False once it holds it no more (it ran out and another task took it)."""
    return Batch.objects.filter(pk=batch_id, lease_owner=owner).update(lease_until=_until()) == 1


def release_lease(batch_id: str, owner: str) -> None:
    """Gives the lease up (if still held), so the sweep may start the batch again at once if it is still active."""
    Batch.objects.filter(pk=batch_id, lease_owner=owner).update(lease_owner="", lease_until=None)
