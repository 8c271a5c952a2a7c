"""Tamper evidence: each audit row is hash-chained to the one before; `manage.py audit --verify` names the first
row that was altered or removed; the database trigger refuses UPDATE (and, on PostgreSQL, DELETE) even in raw SQL."""

import contextlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from pantheon_site.audit import record_audit_event, verify_audit_log
from pantheon_site.audit_chain import GENESIS, TABLE, install_trigger, remove_trigger
from pantheon_site.models import AuditEvent

pytestmark = pytest.mark.django_db


def _write(n: int) -> list[AuditEvent]:
    return [
        record_audit_event("token_create", "accepted", actor_kind="cli", actor_label="ops", reason=f"event {i}")
        for i in range(n)
    ]


def _verify() -> str:
    out = StringIO()
    call_command("audit", "--verify", stdout=out)
    return out.getvalue()


@contextlib.contextmanager
def trigger_dropped():
    """The append-only trigger off for the block: what someone with the table owner's rights could do."""
    remove_trigger(connection)
    try:
        yield
    finally:
        install_trigger(connection)


def _raw(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_each_event_is_chained_to_the_one_before():
    events = _write(3)
    assert events[0].previous_hash == GENESIS
    assert events[1].previous_hash == events[0].row_hash
    assert events[2].previous_hash == events[1].row_hash
    assert len({e.row_hash for e in events}) == 3
    assert "3 events verified" in _verify()


def test_events_written_in_bulk_are_chained_too():
    _write(1)
    AuditEvent.objects.bulk_create(
        [AuditEvent(operation="model_list", outcome="accepted", actor_kind="system") for _ in range(4)]
    )
    _write(1)
    assert verify_audit_log().checked == 6
    assert verify_audit_log().intact


def test_altering_one_row_with_raw_sql_is_named_by_verify():
    events = _write(5)
    with trigger_dropped():
        _raw(f"UPDATE {TABLE} SET reason = %s WHERE id = %s", ["nothing happened", events[2].id])
    with pytest.raises(CommandError, match=f"broken at event {events[2].id}: its content does not match"):
        _verify()


def test_removing_a_row_breaks_the_link_of_the_next():
    events = _write(4)
    with trigger_dropped():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [events[1].id])
    with pytest.raises(CommandError, match=f"broken at event {events[2].id}: its link does not meet"):
        _verify()


def test_removing_the_newest_rows_shows_against_the_chain_head():
    events = _write(3)
    with trigger_dropped():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [events[2].id])
    report = verify_audit_log()
    assert not report.intact and "newest events were removed" in report.problem


def test_the_trigger_refuses_a_raw_update():
    event = _write(1)[0]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw(f"UPDATE {TABLE} SET reason = %s WHERE id = %s", ["rewritten", event.id])
    assert AuditEvent.objects.get(pk=event.pk).reason == "event 0"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's trigger refuses UPDATE only (see audit_chain)")
def test_on_postgresql_the_trigger_refuses_a_raw_delete():
    event = _write(1)[0]
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        _raw(f"DELETE FROM {TABLE} WHERE id = %s", [event.id])
    assert AuditEvent.objects.filter(pk=event.pk).exists()
