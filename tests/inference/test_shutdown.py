"""Graceful shutdown: SIGTERM during a streaming completion lets it finish, refuses new requests with 503
server_shutting_down (Retry-After: 1) meanwhile, then stops the workers and exits cleanly."""

import json
import signal
import threading

import httpx
import psutil
import pytest

from tests.inference.serving import bearer, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG = {"messages": [{"content": "Hi"}], "max_tokens": 500, "logit_bias": {"2": -100}, "temperature": 0}


def test_sigterm_lets_a_running_stream_finish_and_refuses_new_requests(start_server, stories_hf_dir, operator_token):
    # A drain timeout far past the wait for the exit below: a server that waited it out, rather than stopping once
    # the stream is done, fails that wait.
    server = start_server(PANTHEON_SHUTDOWN_DRAIN_TIMEOUT_S="600")
    with httpx.Client(base_url=server.url, timeout=60) as api:
        loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "s"},
                          headers=bearer(operator_token))  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        workers = [psutil.Process(pid) for pid in server.worker_pids()]
        events, first_chunk = [], threading.Event()

        def stream():
            with httpx.Client(base_url=server.url, timeout=60) as client:
                with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            payload = line.removeprefix("data: ")
                            events.append(payload if payload == "[DONE]" else json.loads(payload))
                            first_chunk.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(30)
        server.process.send_signal(signal.SIGTERM)
        assert "[DONE]" not in events  # the stream was still running when the signal came

        def refused():
            try:
                response = api.post("/v1/chat/completions", json={**LONG, "max_tokens": 1})
            except httpx.HTTPError:
                return None
            return response if response.status_code == 503 else None

        response = wait_for(refused, timeout=10, interval=0.02)
        assert response.json()["error"]["type"] == "server_shutting_down"
        assert response.headers["retry-after"] == "1"
        reader.join(60)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert server.process.wait(30) == 0  # once the stream is done, not at the drain timeout
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
