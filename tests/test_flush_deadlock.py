"""`manage.py flush` survives a writer that takes two tables in the opposite order to its TRUNCATE (a running
server writing an audit event while a test empties the database): PostgreSQL fails the TRUNCATE to break the
deadlock, and the flush runs again once the writer is done."""

import threading

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import sql_flush
from django.db import connection

from pantheon_site.models import AuditEvent

pytestmark = pytest.mark.django_db(transaction=True)


def truncate_waiting(cursor) -> bool:
    """Whether another session's TRUNCATE is waiting for a lock (the observer is in autocommit: pg_stat_activity is
    read afresh by each statement only outside a transaction)."""
    cursor.execute(
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
        " WHERE a.query LIKE 'TRUNCATE%%' AND NOT l.granted"
    )
    return cursor.fetchone()[0] > 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="TRUNCATE deadlocks are PostgreSQL's")
def test_a_flush_that_deadlocks_with_a_writer_is_retried():
    AuditEvent.objects.create(operation="probe", outcome="accepted", actor_kind="system")
    [statement] = sql_flush(no_style(), connection)
    tables = [name.strip().strip('"') for name in statement.removeprefix("TRUNCATE").rstrip(";").split(",")]
    first, second = tables[0], tables[1]  # the TRUNCATE locks `first` before it waits for `second`
    settings = connection.settings_dict
    dsn = f"host={settings['HOST']} port={settings['PORT'] or 5432} dbname={settings['NAME']} user={settings['USER']}"
    flushed: list[BaseException | None] = []
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as observer:
        with writer.cursor() as cursor:
            cursor.execute("SET deadlock_timeout = '30s'")  # so PostgreSQL picks the TRUNCATE to fail, not us
            cursor.execute(f'LOCK TABLE "{second}" IN ROW EXCLUSIVE MODE')

            def flush() -> None:
                try:
                    call_command("flush", interactive=False, verbosity=0)
                    flushed.append(None)
                except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                    flushed.append(exc)

            flusher = threading.Thread(target=flush)
            flusher.start()
            with observer.cursor() as watch:
                for _ in range(200):
                    if truncate_waiting(watch):
                        break
                    threading.Event().wait(0.02)
            # The TRUNCATE holds `first` and waits for `second`, which we hold: taking `first` closes the cycle.
            cursor.execute(f'LOCK TABLE "{first}" IN ROW EXCLUSIVE MODE')
        writer.commit()
        flusher.join(timeout=60)
    assert flushed == [None]
    assert not AuditEvent.objects.exists()
