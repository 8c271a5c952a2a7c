"""PostgreSQL stopped under a serving server, then started again (docs/reliability.md).

While it is down, /v1 keeps answering; every route that needs the database (the operator API, the weights API, the
UI) answers 503 with Retry-After in its own envelope, with one log line and no traceback; nothing an operator asked
for half-happens. When it is back, everything works again and the rows agree with what is served."""

from __future__ import annotations

import os
import signal
import threading

import httpx
import psycopg
import pytest

from tests.faults.private_services import sign_in
from tests.inference.serving import bearer, run_manage, wait_for

CHAT = {"model": "stories", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 8}


class ChatLoad:
    """Chat completions one after another in a thread, until stopped; the statuses they got."""

    def __init__(self, url: str):
        self.url, self.statuses, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                self.statuses.append(client.post("/v1/chat/completions", json=CHAT).status_code)

    def __enter__(self) -> ChatLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def served_rows(database_url: str) -> list[tuple[str, str]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT served_name, state FROM inference_modelinstance ORDER BY served_name").fetchall()


def test_database_down_is_503_with_retry_after_and_one_log_line_then_everything_recovers(stack, stories_hf_dir):
    server, token = stack.server, stack.operator_token
    api = httpx.Client(base_url=server.url, timeout=60, headers=bearer(token))
    loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"})
    assert loaded.status_code == 200, loaded.text
    ui = sign_in(server.url, *stack.staff)
    assert ui.get("/ui/models/").status_code == 200

    with ChatLoad(server.url) as load:
        wait_for(lambda: len(load.statuses) >= 2)
        stack.postgres.stop("immediate")
        served_during_outage = len(load.statuses)
        refused = {
            "list": api.get("/admin/models"),
            "load": api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "second"}),
            "unload": api.post("/admin/models/unload", json={"name": "stories"}),
            "weights": api.get("/api/weights/checkpoints"),
            "ui": ui.get("/ui/models/"),
        }
        health = httpx.get(f"{server.url}/api/health/detailed", timeout=60)
        wait_for(lambda: len(load.statuses) >= served_during_outage + 3)  # /v1 still answers with it down
        stack.postgres.start()

        for name, response in refused.items():
            assert response.status_code == 503, (name, response.text)
            assert int(response.headers["Retry-After"]) > 0, name
        assert refused["list"].json()["error"]["type"] == "service_unavailable"
        weights_error = refused["weights"].json()
        assert weights_error["success"] is False and weights_error["error"]["code"] == "SERVICE_UNAVAILABLE"
        assert "text/html" in refused["ui"].headers["Content-Type"]
        assert health.status_code == 200  # health answers; a section that needs the database says it failed
        log = server.log()
        assert "Traceback" not in log
        assert log.count("database unavailable:") == len(refused)

        assert wait_for(lambda: api.get("/admin/models").status_code == 200)
    assert set(load.statuses) == {200}

    # Nothing the refused calls asked for happened: "stories" is still served and recorded, "second" is not.
    assert [row["id"] for row in api.get("/admin/models").json()["data"]] == ["stories"]
    assert served_rows(stack.postgres.url) == [("stories", "ready")]
    again = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "second"})
    assert again.status_code == 200, again.text
    assert served_rows(stack.postgres.url) == [("second", "ready"), ("stories", "ready")]
    assert ui.get("/ui/models/").status_code == 200
    assert api.get("/api/weights/checkpoints").status_code == 200
    verified = run_manage(server.env, "audit", "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert api.post("/admin/models/unload", json={"name": "second"}).status_code == 200


def worker_rows(database_url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT device, pid, restarts FROM inference_worker ORDER BY device").fetchall()


def test_a_worker_crash_while_the_database_is_down_is_mirrored_when_it_returns(stack, stories_hf_dir):
    """The control plane's mirror: with the database away it says so once and serves from memory; a worker that
    crashes meanwhile is restarted and reloaded as ever; the rows catch up when the database returns."""
    server = stack.server
    api = httpx.Client(base_url=server.url, timeout=60, headers=bearer(stack.operator_token))
    if not api.get("/admin/models").json()["data"]:
        api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"}).raise_for_status()
    [pid] = server.worker_pids()
    logged_before = len(server.log())
    stack.postgres.stop("immediate")
    os.kill(pid, signal.SIGKILL)
    [new_pid] = wait_for(lambda: [p for p in server.worker_pids() if p != pid], timeout=30)
    wait_for(lambda: httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=60).status_code == 200)
    stack.postgres.start()

    wait_for(lambda: worker_rows(stack.postgres.url)[0][1] == new_pid, timeout=60)
    [(device, _, restarts)] = worker_rows(stack.postgres.url)
    assert device == "cpu" and restarts >= 1
    wait_for(lambda: served_rows(stack.postgres.url) == [("stories", "ready")], timeout=30)
    log = server.log()[logged_before:]
    assert "Traceback" not in log
    assert log.count("the database is unavailable") == 1  # said once, not once a sync
    assert "the database is reachable again" in log


@pytest.fixture(scope="module")
def client_token_stack(tmp_path_factory):
    from tests.faults.conftest import private_stack

    built = private_stack(tmp_path_factory.mktemp("faults-tokens"), PANTHEON_REQUIRE_CLIENT_TOKENS="1")
    yield built
    built.server.stop()
    built.postgres.remove()


def test_with_client_tokens_required_v1_answers_503_while_tokens_cannot_be_checked(client_token_stack):
    """A token cannot be checked without the database (a revoked one must not pass), so /v1 then says retry."""
    stack = client_token_stack
    with httpx.Client(base_url=stack.server.url, timeout=60, headers=bearer(stack.operator_token)) as client:
        assert client.get("/v1/models").status_code == 200
        stack.postgres.stop("immediate")
        refused = client.get("/v1/models")
        stack.postgres.start()
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["Retry-After"]) > 0
        assert refused.json()["error"]["type"] == "service_unavailable"
        assert wait_for(lambda: client.get("/v1/models").status_code == 200)
    assert "Traceback" not in stack.server.log()
