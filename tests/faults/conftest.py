"""Fixtures of the fault tests: a server on a PostgreSQL cluster of its own (tests/faults/private_services.py), with
an operator token and a staff user made there, so the test may stop and start the database under it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.private_services import PrivatePostgres
from tests.inference.serving import PantheonServer, run_manage, serving_env


@dataclass
class PrivateStack:
    postgres: PrivatePostgres
    server: PantheonServer
    operator_token: str
    staff: tuple[str, str]  # a staff user's name and password, for the UI


def private_stack(root: Path, **env: str) -> PrivateStack:
    """A private PostgreSQL, migrated, with an operator token and a staff user, and a server started on it."""
    postgres = PrivatePostgres().start()
    server_env = serving_env(root, DATABASE_URL=postgres.url, **env)
    superuser = ["createsuperuser", "--no-input", "--username", "staff", "--email", "staff@example.org"]
    for command in (["migrate", "--no-input"], superuser):
        done = run_manage({**server_env, "DJANGO_SUPERUSER_PASSWORD": "staff-pass-1"}, *command)
        assert done.returncode == 0, done.stderr
    created = run_manage(server_env, "create_token", "--role", "operator", "--label", "ops")
    assert created.returncode == 0, created.stderr
    server = PantheonServer(root, server_env).start()
    return PrivateStack(postgres, server, created.stdout.strip().splitlines()[-1], ("staff", "staff-pass-1"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    built = private_stack(tmp_path_factory.mktemp("faults"))
    yield built
    built.server.stop()
    built.postgres.remove()


# The fixtures of tests/inference/conftest.py (a server per module on the test database, an operator's client),
# for the fault tests that need no database of their own.
from tests.inference.conftest import api, client_token, operator_token, server, serving_db, start_server  # noqa: E402

__all__ = ["api", "client_token", "operator_token", "server", "serving_db", "start_server", "stack"]
