"""The suite runs on the database the environment names: PostgreSQL when DATABASE_URL is set (CI), else SQLite."""

import os

import pytest
from django.db import connection

from pantheon_site.models import AuditEvent


@pytest.mark.django_db
def test_suite_runs_on_the_configured_database():
    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected
    # and the tables are really there on that backend
    AuditEvent.objects.create(operation="probe", outcome="accepted", actor_kind="system")
    assert AuditEvent.objects.filter(operation="probe").count() == 1
