"""Which database errors are "the database cannot be reached" (503, retry) and which stay bugs (500): real errors
from PostgreSQL through Django, not built by hand."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection
from django.db.backends.postgresql.base import DatabaseWrapper

from pantheon_site.errors import database_unavailable
from tests.inference.serving import free_port


@pytest.mark.django_db
def test_a_refused_connection_is_service_unavailable_with_retry_after():
    unreachable = DatabaseWrapper({**connection.settings_dict, "PORT": free_port()})
    with pytest.raises(OperationalError) as refused:
        unreachable.ensure_connection()
    error = database_unavailable(refused.value)
    assert (error.status, error.type, error.reason) == (503, "service_unavailable", "database_unavailable")
    assert int(error.headers["Retry-After"]) > 0


@pytest.mark.django_db
def test_a_query_the_server_cancels_stays_a_server_error():
    """57014 (query_canceled) is an OperationalError too, but the server answered: a bug or a limit, not an outage."""
    with connection.cursor() as cursor, pytest.raises(OperationalError) as cancelled:
        cursor.execute("SET LOCAL statement_timeout = 1; SELECT pg_sleep(1)")
    assert database_unavailable(cancelled.value) is None
