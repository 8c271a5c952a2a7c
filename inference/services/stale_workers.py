"""Worker rows left behind by a `serve` that died without stopping (kill -9, a lost machine): marked dead.

While `serve` runs, its control plane rewrites every worker's row at least every HEARTBEAT_RECORD_S
(inference/runtime/control_plane.py), whatever the worker is doing, so a row's `updated_at` is the last time a
running serve vouched for it. A worker that stops heartbeating under a running serve is the supervisor's to kill
and restart; only rows nobody has vouched for in PANTHEON_WORKER_STALE_AFTER_S are stale: a serve that died leaves
its rows `starting` or `ready` for ever. Those become `dead`, and their instances `failed` with the reason in
`last_error` (the model no longer shows as served, and the catalogue lets it be removed). A later `serve` start
forgets them as it forgets every row of a previous run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.models import InstanceState, ModelInstance, Worker, WorkerState
from inference.runtime.control_plane import HEARTBEAT_RECORD_S, SYNC_INTERVAL_S
from pantheon_site.audit import record_audit_event
from pantheon_site.models import Outcome

OPERATION = "worker_marked_dead"
LIVE_STATES = (WorkerState.STARTING, WorkerState.READY)


def mark_stale_workers(stale_after_s: float | None = None, *, now: datetime | None = None) -> list[str]:
    """Marks dead every starting or ready worker whose row no running serve rewrote in `stale_after_s` (default
    PANTHEON_WORKER_STALE_AFTER_S), fails its instances and audits each; returns the devices marked. Each row is
    marked with a conditional update, so a serve that rewrote it meanwhile keeps it. Refuses (ValueError) a
    threshold a running serve's rewrites could miss."""
    stale_after_s = settings.PANTHEON_WORKER_STALE_AFTER_S if stale_after_s is None else stale_after_s
    if stale_after_s <= HEARTBEAT_RECORD_S + SYNC_INTERVAL_S:
        raise ValueError(
            f"a worker row is rewritten every {HEARTBEAT_RECORD_S:g} s while serve runs: "
            f"the stale threshold must exceed {HEARTBEAT_RECORD_S + SYNC_INTERVAL_S:g} s"
        )
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=stale_after_s)
    marked = []
    for worker in Worker.objects.filter(state__in=LIVE_STATES, updated_at__lt=cutoff):
        with transaction.atomic():
            claimed = Worker.objects.filter(pk=worker.pk, state__in=LIVE_STATES, updated_at__lt=cutoff)
            if not claimed.update(state=WorkerState.DEAD):
                continue
            reason = f"its serve stopped updating it (last at {worker.updated_at.isoformat()}); marked dead"
            instances = ModelInstance.objects.filter(worker=worker).exclude(state=InstanceState.FAILED)
            served = list(instances.values_list("served_name", flat=True))
            instances.update(state=InstanceState.FAILED, last_error=f"worker {worker.device}: {reason}", updated_at=now)
            record_audit_event(
                OPERATION,
                Outcome.ACCEPTED,
                actor_kind="system",
                reason="serve_gone",
                details={
                    "device": worker.device,
                    "pid": worker.pid,
                    "was": worker.state,
                    "last_update": worker.updated_at.isoformat(),
                    "last_heartbeat": worker.last_heartbeat.isoformat() if worker.last_heartbeat else None,
                    "instances": served,
                },
            )
        marked.append(worker.device)
    return marked
