"""Fixtures of the UI tests: a staff user and a client signed in as it, and for the browser tests a real server
(tests/inference's fixtures)."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures, for the browser tests)

STAFF_PASSWORD = "correct horse battery"


@pytest.fixture
def staff_user(transactional_db):
    return get_user_model().objects.create_user("olga", password=STAFF_PASSWORD, is_staff=True)


@pytest.fixture
def operator(staff_user) -> Client:
    """A client signed in as the staff user."""
    client = Client()
    client.force_login(staff_user)
    return client
