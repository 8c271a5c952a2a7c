"""The error table of POST /v1/chat/completions (and the 404s of unknown routes) against a running server: each bad
request gets the spec's status, type and headers, and changes nothing — the models it touched still serve."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pantheon_site.models import AuditEvent
from tests.inference.serving import bearer, sse_events

pytestmark = pytest.mark.django_db(transaction=True)

HELLO = [{"role": "user", "content": "Hi"}]
LONG = [{"role": "user", "content": " ".join(["Once upon a time there was a little cat."] * 8)}]


@pytest.fixture(scope="module")
def server(start_server):
    # No queue: a model decoding at its max_concurrent refuses the next request at once (429).
    return start_server(PANTHEON_QUEUE_DEPTH="0")


@pytest.fixture
def api(server, operator_token):
    """An HTTP client for the server; every model the test loaded is unloaded again after it."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
        for row in client.get("/admin/models", headers=bearer(operator_token)).json()["data"]:
            client.post("/admin/models/unload", json={"name": row["id"]}, headers=bearer(operator_token))


@pytest.fixture
def load(api, operator_token):
    def load(path, name, **options):
        response = api.post("/admin/models/load", json={"path": str(path), "name": name, **options},
                            headers=bearer(operator_token))  # fmt: skip
        assert response.status_code == 200, response.text
        return response.json()

    return load


def chat(api, messages=HELLO, headers=None, **fields):
    return api.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2, **fields}, headers=headers)


def assert_error(response, status, type_):
    assert response.status_code == status, response.text
    assert response.headers["access-control-allow-origin"] == "*"
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] is None and error["message"]
    return error


def test_no_models_loaded_is_503(api):
    assert_error(chat(api), 503, "no_models_loaded")
    assert api.get("/v1/models").json()["data"] == []


@pytest.mark.parametrize(
    "body",
    [b"", b"{not json", b"[1, 2]", b"{}", b'{"messages": []}', b'{"messages": "hi"}',
     b'{"messages": [{"role": "wizard", "content": "x"}]}', b'{"messages": [{"content": "x"}], "top_k": "many"}'],
)  # fmt: skip
def test_invalid_bodies_are_400_and_generate_nothing(api, load, stories_hf_dir, body, operator_token):
    load(stories_hf_dir, "stories")
    response = api.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_request_error")
    [row] = api.get("/admin/models", headers=bearer(operator_token)).json()["data"]
    assert row["live"]["running"] == 0 and row["live"]["waiting"] == 0
    assert chat(api).status_code == 200


def test_several_models_need_an_exact_name(api, load, stories_hf_dir, stories_gguf_path):
    load(stories_hf_dir, "a")
    load(stories_gguf_path, "b")
    error = assert_error(chat(api, model="c"), 404, "model_not_found")
    assert "'c'" in error["message"]
    assert_error(chat(api), 404, "model_not_found")
    assert chat(api, model="a").json()["model"] == "a"
    assert chat(api, model="b").json()["model"] == "b"
    assert sorted(m["id"] for m in api.get("/v1/models").json()["data"]) == ["a", "b"]


def test_one_model_takes_any_name(api, load, stories_hf_dir):
    load(stories_hf_dir, "a")
    assert chat(api, model="gpt-4o").json()["model"] == "a"
    assert chat(api).json()["model"] == "a"


def test_context_over_budget_in_both_forms(api, load, stories_hf_dir):
    load(stories_hf_dir, "small", ctx_cap=24)
    assert api.get("/v1/models").json()["data"][0]["context_window"] == 24
    error = assert_error(chat(api, LONG), 422, "context_over_budget")
    assert "kv_cap 24" in error["message"] and "kv_used" in error["message"]
    with api.stream("POST", "/v1/chat/completions", json={"messages": LONG, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        [event] = sse_events(response)
    assert event["error"]["type"] == "context_over_budget" and event["error"]["code"] is None
    assert event["error"]["kv_cap"] == 24 and event["error"]["kv_used"] > 24
    # Nothing changed: the model still answers a prompt that fits, and reports the same window.
    assert chat(api, max_tokens=1).json()["usage"]["kv_cap"] == 24


def test_a_busy_model_refuses_with_429_and_retry_after(api, load, stories_hf_dir):
    load(stories_hf_dir, "one", max_concurrent=1)
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda _: chat(api, max_tokens=400, temperature=0), range(4)))
    busy = [r for r in responses if r.status_code == 429]
    assert busy and any(r.status_code == 200 for r in responses)
    for response in busy:
        assert_error(response, 429, "server_busy")
        assert int(response.headers["retry-after"]) >= 1
    assert chat(api).status_code == 200


def test_catalogued_model_loads_on_demand_unless_the_policy_refuses(api, load, stories_hf_dir, operator_token):
    load(stories_hf_dir, "lazy")
    api.post("/admin/models/unload", json={"name": "lazy"}, headers=bearer(operator_token))
    refused = chat(api, model="lazy", headers={"X-miLLM-Load-Policy": "refuse"})
    assert_error(refused, 404, "model_not_found")
    assert api.get("/admin/models", headers=bearer(operator_token)).json()["data"] == []
    with ThreadPoolExecutor(3) as pool:  # concurrent first requests share one load
        responses = list(pool.map(lambda _: chat(api, model="lazy"), range(3)))
    assert [(r.status_code, r.json()["model"]) for r in responses] == [(200, "lazy")] * 3
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["lazy"]
    event = AuditEvent.objects.filter(operation="model_load", actor_kind="system").get()
    assert (event.outcome, event.model, event.details["trigger"]) == ("accepted", "lazy", "on_demand")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/nothing"), ("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("GET", "/v1/completions"),
     ("DELETE", "/")],
)  # fmt: skip
def test_other_paths_and_methods_are_404_unknown_route(api, method, path):
    error = assert_error(api.request(method, path), 404, "not_found")
    assert error["message"] == "unknown route"


def test_options_is_the_cors_preflight(api):
    response = api.options("/v1/chat/completions")
    assert response.status_code == 200 and response.json() == {}
    assert response.headers["access-control-allow-origin"] == "*"


def test_health(api):
    response = api.get("/")
    body = response.json()
    assert response.headers["access-control-allow-origin"] == "*"
    assert body["service"] == "pantheon" and body["status"] == "ok"
    assert body["backend"] in ("cpu", "cuda") and body["build"]
    assert body["accelerator"] == (body["dies_visible"] > 0)


def test_errors_are_json_in_the_openai_envelope(api):
    body = json.loads(chat(api).content)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code"}
