"""Fixtures for tests that run Pantheon as a user does (see serving.py).

A server and the tests talk to one database, so these tests cannot run inside a rolled-back transaction: they are
transactional (`pytestmark = pytest.mark.django_db(transaction=True)`: the database is flushed after each test, so
each test sees only its own audit events and rows). A server lives for a whole module; module fixtures get database
access through `serving_db`, which flushes once more when the module's servers have stopped.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command

from pantheon_site.tokens import do_create_token
from tests.inference.serving import PantheonServer, operator_client, serving_env


@pytest.fixture(scope="module")
def serving_db(django_db_setup, django_db_blocker):
    """Database access for a module's fixtures; the database is flushed when the module is done (after its servers
    stopped, so nothing they wrote reaches the next module)."""
    with django_db_blocker.unblock():
        yield
        call_command("flush", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def start_server(serving_db, tmp_path_factory):
    """`start_server(**env)` starts a server (env: extra settings, e.g. PANTHEON_QUEUE_DEPTH="0"); all stop at the
    end of the module."""
    servers: list[PantheonServer] = []

    def start(**env: str) -> PantheonServer:
        data_dir = tmp_path_factory.mktemp("pantheon-data")
        server = PantheonServer(data_dir, serving_env(data_dir, **env))
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def operator_token(transactional_db) -> str:
    """An operator token's secret (created for each test: the database is flushed after each)."""
    return do_create_token("operator", "ops")[1]


@pytest.fixture
def client_token(transactional_db) -> str:
    return do_create_token("client", "app")[1]


@pytest.fixture(scope="module")
def server(start_server) -> PantheonServer:
    """The module's server with the default settings (a module may override this fixture)."""
    return start_server()


@pytest.fixture
def api(server, operator_token):
    """An operator's client of the module's server; unloads whatever the test left loaded."""
    with operator_client(server, operator_token) as client:
        yield client
