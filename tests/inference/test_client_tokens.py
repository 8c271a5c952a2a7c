"""PANTHEON_REQUIRE_CLIENT_TOKENS: /v1 then needs a bearer token of any role, or the running server's local
credential (what the Celery worker running batches on this host presents, counted against no rate limit), and
refuses the rest with 401."""

import httpx
import pytest

from pantheon_site.local_credential import new_admin_secret
from pantheon_site.tokens import do_revoke_token
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(start_server):
    # A small rate limit: each test's token is new (the database is flushed between tests) and makes fewer calls.
    return start_server(PANTHEON_REQUIRE_CLIENT_TOKENS="true", PANTHEON_RATE_LIMIT_PER_MINUTE=str(RATE))


RATE = 3


def test_v1_without_a_token_is_401(server):
    response = httpx.get(server.url + "/v1/models")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "unauthorized"
    chat = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 401


def test_v1_with_a_client_token_answers(server, client_token):
    response = httpx.get(server.url + "/v1/models", headers=bearer(client_token))
    assert response.status_code == 200
    assert response.json()["object"] == "list"
    assert client_token not in response.text


def test_v1_with_a_revoked_token_is_401(server, client_token):
    do_revoke_token("app")
    response = httpx.get(server.url + "/v1/models", headers=bearer(client_token))
    assert response.status_code == 401
    assert client_token not in response.text


def test_v1_with_the_servers_local_credential_answers_and_is_not_rate_limited(server, client_token):
    local = bearer(server.run_file()["admin_secret"])
    for _ in range(RATE + 2):
        assert httpx.get(server.url + "/v1/models", headers=local).status_code == 200
    chat = httpx.post(server.url + "/v1/chat/completions", headers=local,
                      json={"messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    assert chat.status_code == 503 and chat.json()["error"]["type"] == "no_models_loaded"  # past the token check
    # a token makes the same calls and meets the limit
    statuses = [httpx.get(server.url + "/v1/models", headers=bearer(client_token)).status_code for _ in range(RATE + 1)]
    assert statuses == [200] * RATE + [429]


def test_v1_with_a_local_credential_of_another_run_is_401(server):
    response = httpx.get(server.url + "/v1/models", headers=bearer(new_admin_secret()))
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "unauthorized"
