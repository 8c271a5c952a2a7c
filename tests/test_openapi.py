"""The OpenAPI document (pantheon_site/openapi.py, docs/api/openapi.yaml): generated from the code, committed, served,
and covering every JSON route in its envelope. tests/inference/test_fuzz_api.py holds a running server to it."""

from pathlib import Path

import pytest
import yaml
from django.core.management import call_command
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "docs" / "api" / "openapi.yaml"
# The UI's HTML pages; the document itself; Prometheus's text exposition for a scraper (docs/api/openapi.md).
NOT_JSON = ("/ui/", "/api/schema/", "/metrics")


def generated(tmp_path) -> str:
    out = tmp_path / "openapi.yaml"
    call_command("spectacular", file=str(out), validate=True, fail_on_warn=True)
    return out.read_text()


def test_the_committed_document_is_what_the_code_generates(tmp_path):
    """Drift: a change to a route's description, body or answer shape without `manage.py spectacular --file
    docs/api/openapi.yaml` fails here."""
    regenerate = "regenerate it: manage.py spectacular --file docs/api/openapi.yaml"
    assert generated(tmp_path) == COMMITTED.read_text(), regenerate


def _routes(patterns, prefix="/"):
    """(path in OpenAPI's spelling, view) of every route of the URL conf."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern).replace("<str:", "{").replace(">", "}")
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield route, pattern.callback


@pytest.fixture(scope="module")
def document() -> dict:
    return yaml.safe_load(COMMITTED.read_text())


def test_every_json_route_is_in_the_document_with_its_method(document):
    routes = [(path, view) for path, view in _routes(get_resolver().url_patterns) if not path.startswith(NOT_JSON)]
    assert len(routes) >= 31
    missing = [
        path
        for path, view in routes
        if path not in document["paths"]
        or not {m.lower() for m in getattr(view, "http_methods", {"GET"})} <= set(document["paths"][path])
    ]
    assert missing == []
    assert set(document["paths"]["/v1/responses/{response_id}"]) == {"get", "delete"}


def test_errors_are_documented_in_each_family_s_envelope(document):
    for path, operations in document["paths"].items():
        envelope = "ManagementError" if path.startswith("/api/weights/") else "OpenAIError"
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) < 400:
                    continue
                schema = response["content"]["application/json"]["schema"]["$ref"]
                assert schema == f"#/components/schemas/{envelope}", (method, path, status)
                headers = response.get("headers", {})
                if status == "401":
                    assert "WWW-Authenticate" in headers, (method, path)
                if status in ("429", "503"):
                    assert "Retry-After" in headers, (method, path)


def test_operator_routes_need_a_token_and_client_routes_take_one(document):
    for path, operations in document["paths"].items():
        for operation in operations.values():
            security = operation.get("security", [])
            if path.startswith("/admin/"):
                assert security == [{"bearer": []}], path
                assert {"401", "403"} <= set(operation["responses"]), path
            elif path.startswith(("/v1/", "/session/")):
                assert security == [{"bearer": []}, {}], path


def test_every_route_that_takes_a_token_documents_the_rate_limit(document):
    """PANTHEON_RATE_LIMIT_PER_MINUTE counts every call that presents a token (pantheon_site/rate_limit.py): each
    such route may answer 429 with Retry-After."""
    missing = [
        (method, path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if {"bearer": []} in operation.get("security", []) and "429" not in operation["responses"]
    ]
    assert missing == []


def test_the_document_is_served_without_a_token(document):
    """GET /api/schema/ answers the committed document (JSON on ?format=json), open like vLLM's /openapi.json."""
    as_yaml = Client().get("/api/schema/")
    assert as_yaml.status_code == 200
    assert yaml.safe_load(as_yaml.content) == document
    as_json = Client().get("/api/schema/?format=json")
    assert as_json.status_code == 200 and as_json.json() == document
