"""The weights barrier's timers and its step boundary over HTTP, on a server with short timers: the watchdog tears
a commit left open (503 weights_torn on /v1 with Retry-After) and a late commit-end returns clean with overran; an
unanswered hold resumes by itself; a silent trainer goes stale and only an operator can clear it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from inference.models import CatalogModel
from pantheon_trainer.client import WeightsClient
from tests.inference.serving import wait_for
from tests.weights.schema_check import validate_weights_response
from tests.weights.weights_calls import Holder, load_attachable, new_token, status, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = [{"role": "user", "content": "Once upon a time"}]
HOLD_S, HEARTBEAT_S, WATCHDOG_MS = 1.0, 1.5, 800


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(
        WEIGHTS_HOLD_TIMEOUT_S=str(HOLD_S),
        WEIGHTS_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_S),
        WEIGHTS_HEARTBEAT_INTERVAL_HINT_S="0.3",
        WEIGHTS_COMMIT_WATCHDOG_MS=str(WATCHDOG_MS),
    )


@pytest.fixture
def holder(server, api, stories_hf_dir):
    holder = Holder(server, load_attachable(api, stories_hf_dir))
    yield holder
    holder.detach()


def chat(server, max_tokens: int = 16, **fields) -> httpx.Response:
    body = {"model": "stories", "messages": PROMPT, "temperature": 0, "max_tokens": max_tokens, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def test_a_commit_left_open_past_the_watchdog_tears_the_set_until_a_late_commit_end(
    server, api, holder, stories_hf_dir
):
    holder.attach()
    holder.ok("quiesce")
    holder.ok("commit-begin")
    torn = wait_for(lambda: (s := status(server))["weights_state"] == "torn" and s)
    assert torn["commit_overran"] is not None and torn["commit"]["overran"] is True
    refused = chat(server)
    assert refused.status_code == 503 and refused.json()["error"]["type"] == "weights_torn"
    assert int(refused.headers["Retry-After"]) >= 1
    other = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "another"})
    assert other.status_code == 409  # attached: refused before the torn check
    late = holder.ok("commit-end")
    assert late["weights_state"] == "clean" and late["overran"] is True and late["commit_ms"] > WATCHDOG_MS
    assert status(server)["last_overrun"]["commit_ms"] == late["commit_ms"]
    holder.ok("resume")
    assert chat(server).status_code == 200


def test_a_torn_set_refuses_other_loads_and_recovers_with_a_weights_load(server, api, holder, stories_hf_dir):
    before = chat(server).json()["choices"][0]["message"]["content"]
    holder.attach()
    holder.ok("quiesce")
    holder.ok("commit-begin")
    assert holder.ok("detach") == {"weights_state": "torn", "barrier": "serving"}  # detach mid-commit tears
    assert chat(server).status_code == 503
    other = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "another"})
    assert other.status_code == 503 and other.json()["error"]["type"] == "weights_torn"
    assert "/api/weights/load" in other.json()["error"]["message"]
    row = CatalogModel.objects.get(name="stories")
    loaded = weights_call(server, "load", holder.token, body={"model_id": row.pk}).data
    assert loaded["weights_state"] == "clean" and status(server)["steps_since_load"] == 0
    assert chat(server).json()["choices"][0]["message"]["content"] == before


def test_an_unanswered_hold_resumes_by_itself_and_serves_what_it_held(server, holder):
    holder.attach()
    holder.ok("quiesce")
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(chat, server) for _ in range(2)]
        resumed = wait_for(lambda: (s := status(server))["barrier"] == "serving" and s, timeout=HOLD_S * 10)
        assert all(f.result().status_code == 200 for f in held)
    assert resumed["last_hold_timeout_at"] is not None and resumed["weights_state"] == "clean"


def test_a_silent_trainer_goes_stale_and_only_an_operator_clears_it(server, holder):
    holder.attach()
    stale = wait_for(lambda: (s := status(server))["attachment"]["state"] == "stale" and s, timeout=HEARTBEAT_S * 10)
    assert stale["attachment"]["stale_since"] is not None and stale["attached"] is True
    assert weights_call(server, "attach", new_token("trainer", "next")).error[:2] == (409, "ALREADY_ATTACHED")
    assert weights_call(server, "clear-stale", holder.token).error[:2] == (403, "WEIGHTS_FORBIDDEN")
    answer = weights_call(server, "clear-stale", new_token("operator", "ops-2"))
    validate_weights_response("POST /api/weights/clear-stale", answer.body)
    cleared = answer.data
    assert cleared["cleared"]["label"] == "trainer" and cleared["weights_state"] == "clean"
    assert status(server)["attached"] is False
    holder.attachment_id = None
    holder.attach()  # attaching again works once cleared


def test_the_clients_heartbeats_keep_an_attachment_active(server, holder):
    with WeightsClient(server.url, holder.token) as client:
        time.sleep(HEARTBEAT_S * 2)
        assert status(server)["attachment"]["state"] == "active" and client.heartbeat_failures == 0
