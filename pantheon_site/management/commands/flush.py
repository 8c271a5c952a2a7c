"""Django's `flush`, retried when PostgreSQL breaks a deadlock by failing the TRUNCATE.

TRUNCATE locks every table in one statement, in the order Django lists them (a set's order, which changes between
processes), while a running server may be writing an audit event (the chain head, then the event row) or its
worker mirror. When the two take the same tables in opposite orders, PostgreSQL fails one of them; if that was the
flush, it changed nothing (the TRUNCATE is one transaction) and runs again once the writer is done.
"""

from __future__ import annotations

import time

from django.core.management.base import CommandError
from django.core.management.commands.flush import Command as DjangoFlush
from django.db import OperationalError

DEADLOCK_DETECTED = "40P01"  # PostgreSQL's SQLSTATE for a transaction it failed to break a deadlock
ATTEMPTS = 5


def _deadlocked(exc: CommandError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, OperationalError) and getattr(cause.__cause__, "sqlstate", None) == DEADLOCK_DETECTED


class Command(DjangoFlush):
    def handle(self, **options):
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return super().handle(**options)
            except CommandError as exc:
                if attempt == ATTEMPTS or not _deadlocked(exc):
                    raise
                time.sleep(0.05 * attempt)
