"""Audit retention: with PANTHEON_AUDIT_RETENTION_DAYS set, the oldest events go, and the going is itself audited.

Only a prefix of the chain is ever removed: every event before the first one younger than the retention. The prune
checks that prefix's chain first (a broken one is evidence: it is kept, and the refusal audited), deletes it past
the append-only trigger with a transaction-local setting naming the last id it may delete (a stray DELETE has no
such setting and is still refused), and writes one `audit_pruned` event in the same transaction: how many rows, the
oldest and newest pruned ids and times, and `anchor_hash`, the last pruned row's hash, from which
`manage.py audit --verify` then verifies the remaining chain (pantheon_site/audit_chain.py). The chain head stays
locked throughout, so no event is written between the cut and the prune's own event.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone

from pantheon_site.audit import PRUNE_OPERATION, prune_anchors, record_audit_event
from pantheon_site.audit_chain import PRUNE_SETTING, TABLE, verify_chain
from pantheon_site.models import AuditChainHead, AuditEvent, Outcome


@dataclass(frozen=True)
class AuditPrune:
    """What one prune did: `pruned` rows removed (0: none was old enough, or the chain was broken), the event
    it wrote (None when there was nothing to prune)."""

    pruned: int
    event: AuditEvent | None


def prune_audit_log(retention_days: float | None = None, *, now: datetime | None = None) -> AuditPrune:
    """Removes the events older than `retention_days` (default PANTHEON_AUDIT_RETENTION_DAYS; 0 keeps every event)
    and audits the removal as one `audit_pruned` event. A prefix whose chain does not verify is not removed: the
    refusal is audited instead, with the verifier's finding as its reason."""
    days = settings.PANTHEON_AUDIT_RETENTION_DAYS if retention_days is None else retention_days
    if days <= 0:
        return AuditPrune(0, None)
    cutoff = (now or timezone.now()) - timedelta(days=days)
    db = AuditEvent.objects.db
    with transaction.atomic(using=db):
        AuditChainHead.locked(db)  # writers wait: the prune's own event is the next link after the cut
        first_kept = AuditEvent.objects.filter(occurred_at__gte=cutoff).order_by("id").values_list("id", flat=True)
        first_kept_id = first_kept.first()
        doomed = AuditEvent.objects.all() if first_kept_id is None else AuditEvent.objects.filter(id__lt=first_kept_id)
        span = doomed.aggregate(count=Count("id"), oldest_id=Min("id"), newest_id=Max("id"))
        if not span["count"]:
            return AuditPrune(0, None)
        report = verify_chain(doomed.order_by("id").iterator(chunk_size=5000), None, prune_anchors())
        if not report.intact:
            event = record_audit_event(
                PRUNE_OPERATION,
                Outcome.REFUSED,
                actor_kind="system",
                error_type="chain_broken",
                reason=report.describe(),
                details={"retention_days": days, "cutoff": cutoff.isoformat()},
            )
            return AuditPrune(0, event)
        oldest = doomed.order_by("id").only("occurred_at").first()
        newest = doomed.order_by("-id").only("occurred_at", "row_hash").first()
        _delete_through(db, span["newest_id"])
        event = record_audit_event(
            PRUNE_OPERATION,
            Outcome.ACCEPTED,
            actor_kind="system",
            details={
                "retention_days": days,
                "cutoff": cutoff.isoformat(),
                "count": span["count"],
                "oldest_id": span["oldest_id"],
                "newest_id": span["newest_id"],
                "oldest_at": oldest.occurred_at.isoformat(),
                "newest_at": newest.occurred_at.isoformat(),
                "anchor_hash": newest.row_hash,
            },
        )
    return AuditPrune(span["count"], event)


def _delete_through(db: str, last_id: int) -> None:
    """DELETE the rows up to `last_id` past the trigger: on PostgreSQL the trigger lets through a DELETE of rows up
    to the id the transaction-local setting names. It lasts to the end of the transaction and needs no clearing:
    once these rows are gone no row with an id that low remains, and new rows get higher ids. SQLite's trigger
    refuses UPDATE only."""
    connection = connections[db]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT set_config(%s, %s, true)", [PRUNE_SETTING, str(last_id)])
        cursor.execute(f"DELETE FROM {TABLE} WHERE id <= %s", [last_id])
