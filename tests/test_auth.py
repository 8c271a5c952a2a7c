"""Operator auth: 401 with WWW-Authenticate for no/bad tokens, 403 for the wrong role, every call audited once."""

from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.http import JsonResponse
from django.test import AsyncClient, override_settings
from django.urls import path
from django.utils import timezone

from pantheon_site.auth import arequire_client_token, operator_route, require_role
from pantheon_site.errors import Forbidden, LoadFailed, Unauthorized
from pantheon_site.models import AccessToken, AuditEvent
from pantheon_site.tokens import do_create_token, do_revoke_token
from pantheon_site.urls import handler404, handler500  # noqa: F401  (this test urlconf uses the project's)


@operator_route("model_load")
async def load_admin(request):
    request.audit.model = request.GET.get("model", "")
    if request.GET.get("fail"):
        raise LoadFailed("model already loaded", status=409, reason="already_loaded")
    if request.GET.get("crash"):
        raise KeyError("path")
    return JsonResponse({"label": request.access_token.label})


@operator_route("model_list")
async def list_admin(request):
    return JsonResponse({"label": request.access_token.label})


urlpatterns = [path("admin/load", load_admin), path("admin/list", list_admin)]

# Committed rows (transactional_db), because the async views read them from another thread's connection.
pytestmark = pytest.mark.urls(__name__)


@pytest.fixture
def secrets_by_role(transactional_db):
    return {role: do_create_token(role, f"{role}-1")[1] for role in ["operator", "trainer", "client"]}


@pytest.fixture
async def thread_connections_closed():
    """Async ORM calls made by the test itself run on asgiref's worker thread; close its connection afterwards so
    the test database can be dropped (requests close their own)."""
    yield
    await sync_to_async(close_old_connections)()


def bearer(secret: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {secret}"}}


def events() -> list[tuple]:
    return [
        (e.operation, e.outcome, e.error_type, e.reason, e.actor_kind, e.actor_label, e.model)
        for e in AuditEvent.objects.order_by("id")
    ]


def test_an_operator_token_is_accepted_and_the_call_audited_once(client, secrets_by_role):
    headers = {"Authorization": f"Bearer {secrets_by_role['operator']}", "X-Request-Id": "r-1"}
    response = client.get("/admin/list", headers=headers)
    assert response.status_code == 200 and response.json() == {"label": "operator-1"}
    assert events() == [("model_list", "accepted", "", "", "token", "operator-1", "")]
    event = AuditEvent.objects.get()
    assert event.request_id == "r-1" and event.client_address == "127.0.0.1" and event.duration_ms >= 0


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "token_missing"),
        ({"Authorization": "Basic b3BzOnB3"}, "token_malformed"),
        ({"Authorization": "Bearer pth_" + "z" * 43}, "token_unknown"),
    ],
)
def test_missing_or_unknown_tokens_are_401_with_www_authenticate(client, secrets_by_role, headers, reason):
    response = client.get("/admin/list", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json() == {
        "error": {"message": "a valid bearer token is required", "type": "unauthorized", "code": None}
    }
    assert events() == [("model_list", "refused", "unauthorized", reason, "anonymous", "", "")]


def test_revoked_and_expired_tokens_are_401(client, secrets_by_role):
    do_revoke_token("operator-1")
    _, expired = do_create_token("operator", "old", expires_at=timezone.now() - timedelta(minutes=1))
    assert client.get("/admin/list", **bearer(secrets_by_role["operator"])).status_code == 401
    assert client.get("/admin/list", **bearer(expired)).status_code == 401
    assert [e[3] for e in events()] == ["token_revoked", "token_expired"]


@pytest.mark.parametrize("role", ["trainer", "client"])
def test_other_roles_are_403(client, secrets_by_role, role):
    response = client.get("/admin/list", **bearer(secrets_by_role[role]))
    assert response.status_code == 403
    assert "WWW-Authenticate" not in response
    assert response.json()["error"]["type"] == "forbidden"
    assert events() == [("model_list", "refused", "forbidden", f"role_{role}", "token", f"{role}-1", "")]


async def test_async_routes_audit_accepted_and_refused_calls(async_client, secrets_by_role, thread_connections_closed):
    operator = bearer(secrets_by_role["operator"])
    ok = await async_client.get("/admin/load", {"model": "stories"}, **operator)
    assert ok.status_code == 200
    refused = await async_client.get("/admin/load", {"model": "stories", "fail": "1"}, **operator)
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "load_failed"
    no_token = await async_client.get("/admin/load")
    assert no_token.status_code == 401 and no_token["WWW-Authenticate"] == "Bearer"
    assert await sync_to_async(events)() == [
        ("model_load", "accepted", "", "", "token", "operator-1", "stories"),
        ("model_load", "refused", "load_failed", "already_loaded", "token", "operator-1", "stories"),
        ("model_load", "refused", "unauthorized", "token_missing", "anonymous", "", ""),
    ]


async def test_a_view_that_crashes_is_audited_as_a_server_error(secrets_by_role, thread_connections_closed):
    client = AsyncClient(raise_request_exception=False)
    operator = bearer(secrets_by_role["operator"])
    response = await client.get("/admin/load", {"model": "stories", "crash": "1"}, **operator)
    assert response.status_code == 500
    assert await sync_to_async(events)() == [
        ("model_load", "refused", "server_error", "KeyError", "token", "operator-1", "stories")
    ]
    event = await AuditEvent.objects.aget()
    assert event.details == {"message": "'path'"} and event.duration_ms >= 0


def test_require_role_admits_several_roles(rf, secrets_by_role):
    request = rf.post("/api/weights/attach", **bearer(secrets_by_role["trainer"]))
    assert require_role(request, "trainer", "operator", operation="weights_attach").label == "trainer-1"
    with pytest.raises(Forbidden):
        require_role(rf.post("/x", **bearer(secrets_by_role["client"])), "trainer", "operator", operation="w")
    assert [e[:2] for e in events()] == [("w", "refused")]


async def test_client_tokens_are_not_checked_by_default(rf):
    # This test has no database fixture, so any query would fail it: /v1 does not touch the database by default.
    assert await arequire_client_token(rf.post("/v1/chat/completions"), operation="chat_completions") is None


@override_settings(PANTHEON_RATE_LIMIT_PER_MINUTE=1)
async def test_a_rate_limit_leaves_open_v1_free_of_database_work_and_limits(rf):
    # No database fixture again: the limit counts tokens, in memory, so /v1 without them is neither slowed nor limited.
    for _ in range(3):
        assert await arequire_client_token(rf.post("/v1/chat/completions"), operation="chat_completions") is None


@override_settings(PANTHEON_REQUIRE_CLIENT_TOKENS=True)
async def test_client_tokens_when_required(rf, secrets_by_role, thread_connections_closed):
    with pytest.raises(Unauthorized):
        await arequire_client_token(rf.post("/v1/chat/completions"), operation="chat_completions")
    for role in ["client", "trainer", "operator"]:
        request = rf.post("/v1/chat/completions", **bearer(secrets_by_role[role]))
        token = await arequire_client_token(request, operation="chat_completions")
        assert isinstance(token, AccessToken) and token.role == role
