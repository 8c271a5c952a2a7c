"""Audit retention: with a retention set, the oldest events go and the going is audited; the chain still verifies
from the anchor the prune recorded, and every other removal is still reported; a stray DELETE is still refused."""

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from pantheon_site.audit import verify_audit_log
from pantheon_site.audit_chain import TABLE
from pantheon_site.audit_retention import prune_audit_log
from pantheon_site.models import AuditEvent, Outcome
from tests.test_audit_chain import trigger_dropped

pytestmark = pytest.mark.django_db


def _write(n: int, *, days_ago: float = 0.0) -> list[AuditEvent]:
    """`n` events written now through the audit's write path, stamped `days_ago` (as if written then)."""
    at = timezone.now() - timedelta(days=days_ago)
    return [
        AuditEvent.objects.create(
            occurred_at=at,
            operation="token_create",
            outcome="accepted",
            actor_kind="cli",
            reason=f"event {i}",
            details={"i": i},
        )  # fmt: skip
        for i in range(n)
    ]


def _verify() -> str:
    out = StringIO()
    call_command("audit", "--verify", stdout=out)
    return out.getvalue()


def _raw(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_without_a_retention_nothing_is_deleted():
    _write(3, days_ago=400)
    assert prune_audit_log().pruned == 0  # PANTHEON_AUDIT_RETENTION_DAYS defaults to 0: never delete
    assert AuditEvent.objects.count() == 3
    assert not AuditEvent.objects.filter(operation="audit_pruned").exists()


def test_the_events_older_than_the_retention_go_and_the_prune_is_audited():
    old = _write(4, days_ago=40)
    young = _write(2)
    done = prune_audit_log(30)
    assert done.pruned == 4
    remaining = list(AuditEvent.objects.order_by("id"))
    assert [e.id for e in remaining[:2]] == [e.id for e in young]
    event = remaining[-1]
    assert (event.operation, event.outcome, event.actor_kind) == ("audit_pruned", Outcome.ACCEPTED, "system")
    assert event.details["count"] == 4
    assert (event.details["oldest_id"], event.details["newest_id"]) == (old[0].id, old[-1].id)
    assert event.details["oldest_at"] == old[0].occurred_at.isoformat()
    assert event.details["newest_at"] == old[-1].occurred_at.isoformat()
    assert event.details["anchor_hash"] == old[-1].row_hash
    assert "6 events" not in _verify()
    assert "3 events verified (older events were pruned by retention" in _verify()
    assert prune_audit_log(30).pruned == 0  # nothing older is left: no second event
    assert AuditEvent.objects.filter(operation="audit_pruned").count() == 1


def test_a_prune_of_every_event_still_verifies_and_a_second_prune_chains_on():
    _write(3, days_ago=50)
    assert prune_audit_log(30).pruned == 3
    assert "1 events verified" in _verify()  # the prune event alone, linked to the anchor it records
    _write(2, days_ago=0)
    first_prune = AuditEvent.objects.get(operation="audit_pruned")
    # A later prune removes the first prune's event too; the second's anchor is where the chain now starts.
    later = prune_audit_log(1, now=timezone.now() + timedelta(days=2))
    assert later.pruned == 3 and later.event.details["anchor_hash"] != first_prune.details["anchor_hash"]
    assert not AuditEvent.objects.filter(pk=first_prune.pk).exists()
    assert "1 events verified (older events were pruned" in _verify()


def test_the_ui_check_says_the_chain_starts_where_retention_cut_it():
    staff = Client()
    staff.force_login(get_user_model().objects.create_user("ops-admin", password="x" * 12, is_staff=True))
    _write(2, days_ago=40)
    _write(2)
    assert "pruned by retention" not in staff.get(reverse("ui:audit-verify")).content.decode()
    prune_audit_log(30)
    content = staff.get(reverse("ui:audit-verify")).content.decode()
    assert "Hash chain intact: 3 events verified\n  (older events were pruned by retention" in content


@pytest.mark.parametrize("removed", [1, 0], ids=["a row in the middle", "the first row after the cut"])
def test_removing_a_row_after_a_prune_is_still_reported(removed):
    # The anchor names exactly where retention cut: taking the next row too is not retention's doing.
    _write(3, days_ago=40)
    kept = _write(4)
    prune_audit_log(30)
    with trigger_dropped():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [kept[removed].id])
    with pytest.raises(CommandError, match=f"broken at event {kept[removed + 1].id}: its link does not meet"):
        _verify()


def test_removing_old_rows_without_the_prune_is_reported():
    _write(3, days_ago=40)
    kept = _write(2)
    with trigger_dropped():
        _raw(f"DELETE FROM {TABLE} WHERE id < %s", [kept[0].id])
    with pytest.raises(CommandError, match=f"broken at event {kept[0].id}: its link does not meet"):
        _verify()


def test_a_broken_chain_is_not_pruned_and_the_refusal_is_audited():
    old = _write(3, days_ago=40)
    with trigger_dropped():
        _raw(f"UPDATE {TABLE} SET reason = %s WHERE id = %s", ["nothing happened", old[1].id])
    done = prune_audit_log(30)
    assert done.pruned == 0
    assert AuditEvent.objects.filter(pk__in=[e.id for e in old]).count() == 3  # the evidence stays
    assert (done.event.operation, done.event.outcome, done.event.error_type) == (
        "audit_pruned",
        Outcome.REFUSED,
        "chain_broken",
    )
    assert f"broken at event {old[1].id}" in done.event.reason


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's trigger refuses UPDATE only (see audit_chain)")
def test_on_postgresql_a_raw_delete_is_still_refused_before_and_after_a_prune():
    old = _write(2, days_ago=40)
    kept = _write(2)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [old[0].id])
    prune_audit_log(30)  # in this test's transaction: the setting it leaves names only ids already gone
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [kept[0].id])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw(f"UPDATE {TABLE} SET reason = 'x' WHERE id = %s", [kept[0].id])
    assert AuditEvent.objects.filter(pk=kept[0].id).exists()
    assert verify_audit_log().intact


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the prune setting is PostgreSQL's")
def test_on_postgresql_the_prune_setting_lets_through_only_rows_up_to_the_id_it_names():
    events = _write(3)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw("SELECT set_config('pantheon.audit_prune_through', %s, true)", [str(events[0].id)])
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [events[1].id])
    assert AuditEvent.objects.filter(pk=events[1].id).exists()
