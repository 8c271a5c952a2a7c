"""The error tables of the operator routes against a running server: auth refusals, POST /admin/models/load and
POST /admin/models/unload. Each refusal has the spec's status and type, writes one refused audit event, and leaves
the catalogue, the instance rows and the served models as they were."""

import os
import signal
import threading

import httpx
import pytest

from inference.models import CatalogModel, ModelInstance
from pantheon_site.models import AuditEvent
from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN_ROUTES = [("GET", "/admin/models"), ("POST", "/admin/models/load"), ("POST", "/admin/models/unload"),
                ("GET", "/admin/dies")]  # fmt: skip


@pytest.fixture
def stories(api, stories_hf_dir):
    """stories260K loaded as "stories" through the API."""
    response = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"})
    assert response.status_code == 200, response.text
    return response.json()


def state(api):
    """Everything a refused call must leave alone: catalogue rows, instance rows, the served models."""
    catalogue = list(CatalogModel.objects.order_by("name").values())
    instances = list(ModelInstance.objects.order_by("pk").values())
    served = [(r["id"], r["state"], r.get("instance_id")) for r in api.get("/admin/models").json()["data"]]
    return catalogue, instances, served


def assert_refused(response, status, type_, operation):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] is None
    event = AuditEvent.objects.filter(operation=operation).latest("id")
    assert event.outcome == "refused" and event.error_type == type_
    return error


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_no_token_is_401_with_www_authenticate(server, method, path):
    response = httpx.request(method, server.url + path, json={})
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]["type"] == "unauthorized"
    event = AuditEvent.objects.get()
    assert (event.outcome, event.actor_kind, event.error_type) == ("refused", "anonymous", "unauthorized")


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_unknown_or_client_token_is_refused(server, client_token, method, path):
    unknown = httpx.request(method, server.url + path, json={}, headers=bearer("pth_" + "x" * 43))
    assert unknown.status_code == 401 and unknown.json()["error"]["type"] == "unauthorized"
    forbidden = httpx.request(method, server.url + path, json={}, headers=bearer(client_token))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["type"] == "forbidden"
    assert [e.error_type for e in AuditEvent.objects.order_by("id")] == ["unauthorized", "forbidden"]


def test_a_forged_local_credential_is_401(server):
    response = httpx.get(server.url + "/admin/models", headers=bearer("pthl_" + "y" * 43))
    assert response.status_code == 401
    assert AuditEvent.objects.get().error_type == "unauthorized"


@pytest.mark.parametrize(
    "body",
    [b"", b"{bad json", b"[]", b"{}", b'{"name": "x"}', b'{"path": "/m.gguf", "dies": [0,1,2,3,4,5,6,7,8]}'],
)
def test_load_invalid_request(api, stories, body):
    before = state(api)
    response = api.post("/admin/models/load", content=body, headers={"Content-Type": "application/json"})
    assert_refused(response, 400, "invalid_request_error", "model_load")
    assert state(api) == before


@pytest.mark.parametrize("field", ["ctx_cap", "max_sessions", "max_concurrent", "reasoning_budget", "dies"])
def test_load_with_a_count_too_large_for_the_wire_is_400_naming_it(api, stories, stories_hf_dir, field):
    """A count past 2^31 - 1 (found by fuzzing: past 2^64 it could not be encoded for the worker, a 500)."""
    before = state(api)
    huge = 2**70
    body = {"path": str(stories_hf_dir), "name": "big", field: [huge] if field == "dies" else huge}
    error = assert_refused(api.post("/admin/models/load", json=body), 400, "invalid_request_error", "model_load")
    assert error["message"].startswith(field)
    assert state(api) == before


def test_load_from_the_home_of_a_user_who_does_not_exist_is_404(api, stories):
    """`~user/...` with no such user (found by fuzzing: pathlib's RuntimeError was a 500)."""
    before = state(api)
    response = api.post("/admin/models/load", json={"path": "~no-such-user-here/m.gguf"})
    error = assert_refused(response, 404, "load_failed", "model_load")
    assert "home directory" in error["message"]
    assert state(api) == before


def test_load_with_dies_on_a_host_without_them_is_400(api, stories, stories_gguf_path):
    before = state(api)
    visible = api.get("/").json()["dies_visible"]
    response = api.post("/admin/models/load", json={"path": str(stories_gguf_path), "name": "g", "dies": [visible]})
    assert_refused(response, 400, "load_failed", "model_load")
    assert state(api) == before


def test_load_of_a_missing_file_is_404(api, stories, tmp_path):
    before = state(api)
    response = api.post("/admin/models/load", json={"path": str(tmp_path / "absent.gguf")})
    assert_refused(response, 404, "load_failed", "model_load")
    assert state(api) == before


@pytest.mark.parametrize("segment", ["x" * 300 + ".gguf", "x" * 300 + "/config.json"])
def test_load_of_a_path_the_system_cannot_look_at_is_400(api, stories, tmp_path, segment):
    """A segment over the file system's name limit: the system refuses to stat it (not "no such file")."""
    before = state(api)
    response = api.post("/admin/models/load", json={"path": str(tmp_path / segment)})
    error = assert_refused(response, 400, "load_failed", "model_load")
    assert "cannot be read" in error["message"]
    assert state(api) == before


def test_load_of_another_checkpoint_under_a_served_name_is_409(api, stories, stories_gguf_path):
    """The same checkpoint would add a replica (tests/inference/test_replicas.py); another one is refused."""
    before = state(api)
    response = api.post("/admin/models/load", json={"path": str(stories_gguf_path), "name": "stories"})
    error = assert_refused(response, 409, "load_failed", "model_load")
    assert "a replica must load the same checkpoint" in error["message"]
    assert state(api) == before


def test_load_larger_than_memory_is_refused_by_admission_507(api, stories, tmp_path):
    huge = tmp_path / "huge.gguf"
    with huge.open("wb") as f:
        f.truncate(8 * 2**40)  # sparse: 8 TiB on paper, nothing on disk
    before = state(api)
    response = api.post("/admin/models/load", json={"path": str(huge)})
    error = assert_refused(response, 507, "load_failed", "model_load")
    assert "admission" in error["message"]
    assert state(api) == before


@pytest.mark.parametrize("problem", ["garbage", "window"])
def test_load_that_fails_in_the_worker_is_500(api, stories, tmp_path, stories_hf_dir, problem):
    if problem == "garbage":
        path = tmp_path / "garbage.gguf"
        path.write_bytes(b"this is not a model" * 100)
        body = {"path": str(path)}
    else:  # a context window past the model's own (512)
        body = {"path": str(stories_hf_dir), "name": "wide", "ctx_cap": 100_000}
    before = state(api)
    assert_refused(api.post("/admin/models/load", json=body), 500, "load_failed", "model_load")
    assert state(api) == before
    assert api.post("/v1/chat/completions", json={"model": "stories", "messages": [{"content": "x"}],
                                                  "max_tokens": 1}).status_code == 200  # fmt: skip


@pytest.mark.parametrize("body", [b"", b"{bad json", b"{}", b'{"name": ""}', b"[1]"])
def test_unload_invalid_request(api, stories, body):
    before = state(api)
    response = api.post("/admin/models/unload", content=body, headers={"Content-Type": "application/json"})
    assert_refused(response, 400, "invalid_request_error", "model_unload")
    assert state(api) == before


@pytest.mark.parametrize("body", [{"name": "nothing"}, {"id": 999999}])
def test_unload_of_what_is_not_loaded_is_404(api, stories, body):
    before = state(api)
    assert_refused(api.post("/admin/models/unload", json=body), 404, "unload_failed", "model_unload")
    assert state(api) == before


def test_unload_while_unloading_is_409(api, stories, server):
    """While the first unload is under way, a second one is refused. The worker is stopped (SIGSTOP) while the first
    is sent, so however fast it would have drained the generation in flight, the first unload cannot finish before
    the second is answered; the control plane refuses the second without asking the worker."""
    unload, first = {"name": "stories"}, {}

    def send_first():
        first["r"] = api.post("/admin/models/unload", json=unload)

    with httpx.Client(base_url=server.url, timeout=60) as streamer:
        body = {"messages": [{"content": "Hi"}], "temperature": 0, "max_tokens": 500, "stream": True}
        with streamer.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = stream.iter_lines()
            next(lines)
            [worker] = server.worker_pids()
            os.kill(worker, signal.SIGSTOP)
            try:
                unloading = threading.Thread(target=send_first)
                unloading.start()
                # /v1/models lists what takes requests, from the control plane alone: an unloading model leaves it.
                wait_for(lambda: not api.get("/v1/models").json()["data"], timeout=30, interval=0.01)
                second = api.post("/admin/models/unload", json=unload)
            finally:
                os.kill(worker, signal.SIGCONT)
            assert_refused(second, 409, "unload_failed", "model_unload")
            list(lines)
            unloading.join()
    assert first["r"].status_code == 200 and first["r"].json()["unloaded"] == "stories"


def test_dies_on_a_cpu_host(api):
    body = api.get("/admin/dies").json()
    visible = api.get("/").json()["dies_visible"]
    assert body["object"] == "list" and body["n_dies"] == visible and len(body["data"]) == visible
    for die in body["data"]:
        assert die["vram_budget"] >= die["vram_used"] >= 0


def test_admin_models_rows(api, stories, stories_hf_dir):
    [row] = api.get("/admin/models").json()["data"]
    assert row["id"] == "stories" and row["object"] == "model" and row["path"] == str(stories_hf_dir)
    assert row["context_window"] == row["context_window_configured"] == 512
    assert row["max_concurrent"] == row["max_concurrent_configured"] >= 1
    assert row["vram_bytes"] > 0 and row["instance_id"] == stories["instance_id"]
    assert {k: v for k, v in row.items() if k != "live"} == stories  # the load answered with the same row
    assert row["state"] == "ready" and row["live"]["running"] == 0
    event = AuditEvent.objects.filter(operation="model_list").latest("id")
    assert (event.outcome, event.actor_kind, event.actor_label) == ("accepted", "token", "ops")
