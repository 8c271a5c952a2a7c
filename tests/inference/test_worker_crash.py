"""A worker process killed during a streaming completion: the stream ends with a terminal error event at once,
the supervisor starts the worker again with its model, the model serves again, and the crash is audited."""

import json
import os
import signal
import threading
import time

import httpx
import pytest

from inference.models import Worker
from pantheon_site.models import AuditEvent
from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG_STREAM = {"messages": [{"content": "Hi"}], "temperature": 0, "max_tokens": 500, "stream": True}


@pytest.fixture
def api(server, operator_token, stories_hf_dir):
    """A client of the server, with stories260K served as "stories" (loaded unless a test before left it loaded)."""
    with httpx.Client(base_url=server.url, timeout=60) as api:
        if not api.get("/v1/models").json()["data"]:
            loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"},
                              headers=bearer(operator_token))  # fmt: skip
            assert loaded.status_code == 200, loaded.text
        yield api


def running(api, operator_token) -> int:
    [row] = api.get("/admin/models", headers=bearer(operator_token)).json()["data"]
    return row.get("live", {}).get("running", 0)


def full_generation_time(api, body) -> float:
    """How long the whole generation of `body` takes on the server's worker, to the end of its response."""
    started = time.monotonic()
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def test_worker_killed_mid_stream(server, api):
    [pid] = server.worker_pids()
    full = full_generation_time(api, LONG_STREAM)
    with api.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as stream:
        lines = stream.iter_lines()
        for _ in range(3):
            next(lines)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        events = [line for line in lines if line]
        ended_at = time.monotonic()
    assert ended_at - killed_at < full / 2  # long before the generation could have finished by itself
    assert "data: [DONE]" not in events
    error = json.loads(events[-1][len("data: ") :])["error"]
    assert error["type"] == "server_error" and error["code"] is None and "died" in error["message"]

    # The supervisor brings the worker back with the model, which then serves again.
    new_pid = wait_for(lambda: [p for p in server.worker_pids() if p != pid], timeout=30)[0]
    body = {"messages": [{"content": "Hi"}], "max_tokens": 3}
    wait_for(lambda: api.post("/v1/chat/completions", json=body).status_code == 200, timeout=30, interval=0.2)
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["stories"]

    crash = AuditEvent.objects.get(operation="worker_crash")
    assert (crash.outcome, crash.actor_kind, crash.error_type) == ("refused", "system", "server_error")
    assert crash.details["pid"] == pid and crash.details["returncode"] == -signal.SIGKILL
    assert crash.details["models"] == ["stories"] and crash.model == "stories"
    worker = wait_for(lambda: Worker.objects.filter(device="cpu", pid=new_pid, state="ready").first(), timeout=10)
    assert worker.restarts >= 1


def test_a_non_streaming_request_in_flight_gets_500(server, api, operator_token):
    [pid] = server.worker_pids()
    body = {"messages": [{"content": "Hi"}], "temperature": 0, "max_tokens": 500}
    full = full_generation_time(api, body)
    result = {}
    with httpx.Client(base_url=server.url, timeout=60) as other:

        def post():
            result["r"] = other.post("/v1/chat/completions", json=body)
            result["answered_at"] = time.monotonic()

        thread = threading.Thread(target=post)
        thread.start()
        wait_for(lambda: running(api, operator_token) == 1, timeout=30, interval=0.01)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        thread.join(60)  # a hang guard; how soon is judged below
    assert result["answered_at"] - killed_at < full / 2  # long before the generation could have finished by itself
    response = result["r"]
    assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
