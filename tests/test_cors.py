"""CORS as the spec says for the API (every response `Access-Control-Allow-Origin: *`, OPTIONS the preflight: 200
`{}`), and never for the operator UI, whose session cookie a browser would send along from any page."""

from __future__ import annotations

import httpx
import pytest

from tests.inference.conftest import serving_db, start_server  # noqa: F401  (the fixtures)

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = {"Origin": "https://elsewhere.example"}
PREFLIGHT = {**ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}


@pytest.fixture(scope="module")
def http(start_server):  # noqa: F811
    with httpx.Client(base_url=start_server().url, timeout=30, follow_redirects=False) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/", 200),
        ("GET", "/v1/models", 200),
        ("POST", "/v1/chat/completions", 503),
        ("GET", "/admin/models", 401),
        ("POST", "/api/weights/attach", 401),
        ("GET", "/api/weights/status", 200),
        ("GET", "/no/such/route", 404),
    ],
)
def test_every_api_response_allows_any_origin(http, method, path, status):
    response = http.request(method, path, json={"messages": [{"content": "Hi"}]}, headers=ORIGIN)
    assert response.status_code == status
    assert response.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/admin/models/load", "/api/weights/attach", "/nowhere"])
def test_options_on_any_api_path_is_the_preflight(http, path):
    response = http.options(path, headers=PREFLIGHT)
    assert response.status_code == 200 and response.json() == {}
    assert response.headers["access-control-allow-origin"] == "*"
    assert "POST" in response.headers["access-control-allow-methods"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/ui/login/"),
        ("GET", "/ui/"),
        ("POST", "/ui/login/"),
        ("POST", "/ui/tokens/"),
        ("GET", "/ui/static/admin_ui/ui.js"),
        ("GET", "/ui/no-such-page/"),
        ("OPTIONS", "/ui/login/"),
        ("OPTIONS", "/ui/tokens/"),
        ("OPTIONS", "/ui/models/load/"),
    ],
)
def test_the_ui_answers_no_cors_header_preflight_included(http, method, path):
    response = http.request(method, path, headers=PREFLIGHT if method == "OPTIONS" else ORIGIN)
    assert not [name for name in response.headers if name.lower().startswith("access-control-")], response.headers
    if method == "OPTIONS":  # not the API's preflight answer: Django's own (the sign-in page for anyone unsigned)
        assert response.status_code != 200 or response.content != b"{}"
