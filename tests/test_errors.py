"""Errors reach the client in the spec's envelope, with its status, type and headers, however a view fails."""

import re

import pytest
from django.http import JsonResponse
from django.test import override_settings
from django.urls import path
from rest_framework import serializers
from rest_framework.decorators import api_view

from pantheon_site import errors
from pantheon_site.urls import handler400, handler404, handler500  # noqa: F401  (this test urlconf uses the project's)


class _ChatBody(serializers.Serializer):
    messages = serializers.ListField(child=serializers.DictField(), allow_empty=False)
    max_tokens = serializers.IntegerField(required=False, min_value=1)


@api_view(["POST"])
def drf_view(request):
    _ChatBody(data=request.data).is_valid(raise_exception=True)
    return JsonResponse({"ok": True})


async def async_view(request, kind):
    raise {
        "model": errors.ModelNotFound("no model named 'x' is loaded"),
        "busy": errors.ServerBusy(retry_after=2.2),
        "draining": errors.ServerShuttingDown(),
        "budget": errors.ContextOverBudget(kv_used=300, kv_cap=256),
        "load": errors.LoadFailed("already loaded", status=409),
        "crash": RuntimeError("boom"),
    }[kind]


def body_view(request):
    return JsonResponse({"bytes": len(request.body)})


urlpatterns = [
    path("drf", drf_view),
    path("fail/<str:kind>", async_view),
    path("api/weights/fail/<str:kind>", async_view),
    path("body", body_view),
]

pytestmark = pytest.mark.urls(__name__)


def envelope(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "code"}
    assert body["error"]["code"] is None
    return body["error"]


@pytest.mark.urls("pantheon_site.urls")
def test_unknown_paths_get_the_not_found_envelope(client):
    response = client.get("/no/such/route")
    assert response.status_code == 404
    assert envelope(response) == {"message": "unknown route", "type": "not_found", "code": None}


def test_request_id_is_echoed_or_made(client):
    assert client.get("/x", HTTP_X_REQUEST_ID="req-42")["X-Request-Id"] == "req-42"
    assert re.fullmatch(r"[0-9a-f]{32}", client.get("/x")["X-Request-Id"])
    assert re.fullmatch(r"[0-9a-f]{32}", client.get("/x", HTTP_X_REQUEST_ID="bad id\twith spaces")["X-Request-Id"])


@pytest.mark.parametrize(
    ("kind", "status", "type_", "headers"),
    [
        ("model", 404, "model_not_found", {}),
        ("busy", 429, "server_busy", {"Retry-After": "3"}),
        ("draining", 503, "server_shutting_down", {"Retry-After": "1"}),
        ("budget", 422, "context_over_budget", {}),
        ("load", 409, "load_failed", {}),
    ],
)
async def test_async_views_raise_and_the_envelope_follows(async_client, kind, status, type_, headers):
    response = await async_client.get(f"/fail/{kind}")
    assert response.status_code == status
    assert envelope(response)["type"] == type_
    for name, value in headers.items():
        assert response[name] == value
    assert "Retry-After" in response or not headers


async def test_context_over_budget_puts_the_numbers_in_the_message_and_the_stream_event(async_client):
    error = envelope(await async_client.get("/fail/budget"))
    assert "300" in error["message"] and "256" in error["message"]
    assert "kv_used" not in error
    event = errors.openai_error_body(errors.ContextOverBudget(kv_used=300, kv_cap=256), streaming=True)["error"]
    assert (event["type"], event["kv_used"], event["kv_cap"], event["code"]) == ("context_over_budget", 300, 256, None)


async def test_an_unexpected_exception_is_a_500_server_error(async_client):
    async_client.raise_request_exception = False
    response = await async_client.get("/fail/crash")
    assert response.status_code == 500
    assert envelope(response)["type"] == "server_error"
    assert "boom" not in response.content.decode()


async def test_an_unexpected_exception_under_the_weights_api_is_a_500_in_its_envelope(async_client):
    async_client.raise_request_exception = False
    response = await async_client.get("/api/weights/fail/crash")
    assert response.status_code == 500
    body = response.json()
    assert body["success"] is False and body["data"] is None and body["error"]["code"] == "INTERNAL"
    assert "boom" not in response.content.decode()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("{not json", "JSON parse error"),
        ("{}", "messages"),
        ('{"messages": []}', "messages"),
        ('{"messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens"),
    ],
)
def test_drf_errors_become_invalid_request_error(client, body, needle):
    response = client.post("/drf", body, content_type="application/json")
    assert response.status_code == 400
    error = envelope(response)
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"]


def test_drf_wrong_method_is_an_unknown_route(client):
    response = client.get("/drf")
    assert response.status_code == 404
    assert envelope(response)["type"] == "not_found"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=16)
def test_an_oversized_body_is_an_invalid_request(client):
    response = client.post("/body", "x" * 64, content_type="application/json")
    assert response.status_code == 400
    assert envelope(response)["type"] == "invalid_request_error"


def test_unauthorized_and_forbidden_carry_their_headers():
    unauthorized = errors.error_response(errors.Unauthorized())
    assert unauthorized.status_code == 401 and unauthorized["WWW-Authenticate"] == "Bearer"
    forbidden = errors.error_response(errors.Forbidden())
    assert forbidden.status_code == 403 and "WWW-Authenticate" not in forbidden
