"""Fixtures of the UI tests: a staff user, and for the browser tests a real server (tests/inference's fixtures)."""

import pytest
from django.contrib.auth import get_user_model

from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures, for the browser tests)

STAFF_PASSWORD = "correct horse battery"


@pytest.fixture
def staff_user(transactional_db):
    return get_user_model().objects.create_user("olga", password=STAFF_PASSWORD, is_staff=True)
