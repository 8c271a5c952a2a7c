"""PANTHEON_REQUIRE_CLIENT_TOKENS: /v1 then needs a bearer token of any role, and refuses the rest with 401."""

import httpx
import pytest

from pantheon_site.tokens import do_revoke_token
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(PANTHEON_REQUIRE_CLIENT_TOKENS="true")


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
