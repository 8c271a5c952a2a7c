"""Access tokens: the secret is shown once and stored nowhere, comparison is constant-time, revoke and expiry work."""

import hashlib
import hmac
import logging
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.management import call_command
from django.db import close_old_connections, connection
from django.test import override_settings
from django.utils import timezone

from pantheon_site import tokens
from pantheon_site.errors import InvalidRequest, NotFound, Unauthorized
from pantheon_site.models import AccessToken, AuditEvent
from pantheon_site.tokens import aauthenticate_token, authenticate_token, do_create_token, do_revoke_token

pytestmark = pytest.mark.django_db


@pytest.fixture
async def thread_connections_closed():
    """Async ORM calls made by the test itself run on asgiref's worker thread; close its connection afterwards so
    the test database can be dropped (requests close their own)."""
    yield
    await sync_to_async(close_old_connections)()


def _all_stored_text() -> str:
    """Every column of every token row, read back with raw SQL (what an attacker with the database sees)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {AccessToken._meta.db_table}")
        return repr(cursor.fetchall())


def test_only_an_hmac_of_the_secret_is_stored():
    token, secret = do_create_token("operator", "ops")
    assert secret.startswith("pth_") and len(secret) >= 40
    stored = _all_stored_text()
    assert secret not in stored
    assert secret[tokens.PREFIX_LENGTH :] not in stored  # not even the secret part after the prefix
    expected = hmac.new(settings.PANTHEON_TOKEN_HMAC_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()
    assert AccessToken.objects.get(label="ops").digest == expected
    assert token.prefix == secret[: tokens.PREFIX_LENGTH]


def test_the_digest_is_keyed_so_another_hmac_key_invalidates_every_token():
    _, secret = do_create_token("operator", "ops")
    assert authenticate_token(secret).label == "ops"
    with override_settings(PANTHEON_TOKEN_HMAC_KEY="another key"):
        assert tokens.token_digest(secret) != AccessToken.objects.get(label="ops").digest
        with pytest.raises(Unauthorized) as refused:
            authenticate_token(secret)
        assert refused.value.reason == "token_unknown"
    assert authenticate_token(secret).label == "ops"  # the key it was made with still finds it


def _whole_database_text() -> str:
    """Every row of every table, read back with raw SQL (a stolen backup)."""
    with connection.cursor() as cursor:
        dump = []
        for table in connection.introspection.table_names():
            cursor.execute(f'SELECT * FROM "{table}"')
            dump.append(repr(cursor.fetchall()))
    return "\n".join(dump)


@pytest.mark.parametrize("role", ["operator", "client"])
def test_the_secret_is_stored_nowhere_in_the_database_after_it_is_used(client, role):
    _, secret = do_create_token(role, "user")
    headers = {"Authorization": f"Bearer {secret}", "X-Request-Id": "r-1"}
    client.get("/admin/models", headers=headers)  # accepted or refused by role: audited either way
    client.post("/api/weights/attach", data="{}", content_type="application/json", headers=headers)
    client.post("/admin/models/load", data="{}", content_type="application/json", headers=headers)
    assert AuditEvent.objects.filter(actor_label="user").count() == 3
    stored = _whole_database_text()
    assert secret not in stored and secret[tokens.PREFIX_LENGTH :] not in stored


def test_secrets_are_random_and_labels_unique():
    _, first = do_create_token("client", "a")
    _, second = do_create_token("client", "b")
    assert first != second
    with pytest.raises(InvalidRequest, match="already exists"):
        do_create_token("operator", "a")
    with pytest.raises(InvalidRequest, match="role"):
        do_create_token("root", "c")
    assert AccessToken.objects.count() == 2


def test_authenticate_finds_the_token_and_marks_it_used():
    created, secret = do_create_token("trainer", "trainer-1")
    assert created.last_used_at is None
    token = authenticate_token(secret)
    assert token.pk == created.pk and token.role == "trainer"
    assert AccessToken.objects.get(pk=created.pk).last_used_at is not None


def test_wrong_secrets_are_refused():
    _, secret = do_create_token("operator", "ops")
    for wrong in [secret[:-1] + ("A" if secret[-1] != "A" else "B"), "pth_" + "x" * 43, "not-a-token", ""]:
        with pytest.raises(Unauthorized) as refused:
            authenticate_token(wrong)
        assert refused.value.reason == "token_unknown"
        assert refused.value.headers["WWW-Authenticate"] == "Bearer"


def test_the_digest_comparison_is_constant_time(monkeypatch):
    _, secret = do_create_token("operator", "ops")
    compared = []
    real = hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    authenticate_token(secret)
    assert compared == [(AccessToken.objects.get(label="ops").digest, tokens.token_digest(secret))]


def test_revoked_tokens_stop_working_and_revoke_is_idempotent():
    _, secret = do_create_token("operator", "ops")
    revoked = do_revoke_token("ops")
    assert revoked.revoked_at is not None
    with pytest.raises(Unauthorized) as refused:
        authenticate_token(secret)
    assert refused.value.reason == "token_revoked"
    assert do_revoke_token("ops").revoked_at == revoked.revoked_at
    with pytest.raises(NotFound):
        do_revoke_token("nobody")


def test_expired_tokens_stop_working():
    _, secret = do_create_token("client", "soon", expires_at=timezone.now() + timedelta(hours=1))
    assert authenticate_token(secret).label == "soon"
    AccessToken.objects.filter(label="soon").update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Unauthorized) as refused:
        authenticate_token(secret)
    assert refused.value.reason == "token_expired"


@pytest.mark.django_db(transaction=True)
async def test_async_authentication_matches_the_sync_one(thread_connections_closed):
    _, secret = await sync_to_async(do_create_token)("operator", "ops")
    token = await aauthenticate_token(secret)
    assert token.label == "ops" and token.last_used_at is not None
    await sync_to_async(do_revoke_token)("ops")
    with pytest.raises(Unauthorized):
        await aauthenticate_token(secret)


def test_the_secret_never_appears_in_list_output_or_logs(caplog):
    caplog.set_level(logging.DEBUG)
    out = StringIO()
    call_command("create_token", role="operator", label="ops", stdout=out)
    secret = out.getvalue().splitlines()[-1]
    authenticate_token(secret)
    listings = StringIO()
    call_command("list_tokens", stdout=listings)
    call_command("audit", stdout=listings)
    call_command("audit", json=True, stdout=listings)
    call_command("revoke_token", "ops", stdout=listings)
    text = listings.getvalue()
    assert "ops" in text
    assert secret not in text and secret[8:] not in text
    assert AccessToken.objects.get(label="ops").digest not in text
    assert secret not in caplog.text
