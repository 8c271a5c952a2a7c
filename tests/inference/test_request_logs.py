"""Request ids and logs, on a real server (`manage.py serve` with a worker process) logging JSON: a client's
X-Request-ID comes back on every response (a chat, a stream, a 404, a 413 refused before Django, a preflight, the
UI and its static files, an operator call, a trainer's weights calls), every log line of the request carries it
(the control plane's and the worker's lines about its sequence), its audit event records it; and the complete log
of the run holds no token secret, no prompt text and no attachment id, unless the debug setting
PANTHEON_LOG_SENSITIVE says so."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from dataclasses import dataclass

import httpx
import pytest

from pantheon_site.models import AuditEvent
from pantheon_site.tokens import do_create_token
from tests.inference.serving import bearer, sse_events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT_TEXT = "Tell me about a heron called Quillfeather Marsh."  # appears nowhere but in the requests
BODY_LIMIT = 64 * 1024


@dataclass
class Run:
    """What one full run of the scenario left: the responses by request id, the log's text, the audit events, and
    what must never be logged (token secrets, the prompt, the attachment id)."""

    responses: dict[str, httpx.Response]
    log: str
    audit: list[AuditEvent]
    operator_token: str
    trainer_token: str
    attachment_id: str
    local_credential: str  # the secret `manage.py` commands present to the running server

    def lines_of(self, request_id: str) -> list[dict]:
        """The log lines that mention `request_id`, each decoded (a line that is not JSON fails the test)."""
        return [json.loads(line) for line in self.log.splitlines() if request_id in line]


def full_run(start_server, model_dir, **env: str) -> Run:
    """Starts a JSON-logging server, sends the scenario's requests, each with its own X-Request-ID, and stops it
    (so its log is complete)."""
    operator = do_create_token("operator", "ops")[1]
    trainer = do_create_token("trainer", "trainer")[1]  # before the load, so the load is attachable
    server = start_server(
        PANTHEON_LOG_FORMAT="json", PANTHEON_LOG_LEVEL="INFO", PANTHEON_MAX_BODY_BYTES=str(BODY_LIMIT), **env
    )
    responses: dict[str, httpx.Response] = {}
    chat = {"model": "stories", "messages": [{"role": "user", "content": PROMPT_TEXT}], "max_tokens": 8}
    with httpx.Client(base_url=server.url, timeout=120) as http:

        def send(request_id: str, method: str, path: str, **kwargs) -> httpx.Response:
            headers = {"X-Request-ID": request_id, **kwargs.pop("headers", {})}
            responses[request_id] = http.request(method, path, headers=headers, **kwargs)
            return responses[request_id]

        load = send("rid-load", "POST", "/admin/models/load", headers=bearer(operator),
                    json={"path": str(model_dir), "name": "stories"})  # fmt: skip
        assert load.status_code == 200, load.text
        assert send("rid-chat", "POST", "/v1/chat/completions", json=chat).status_code == 200
        embed = {"model": "stories", "input": [PROMPT_TEXT, "a second input"]}
        assert send("rid-embed", "POST", "/v1/embeddings", json=embed).status_code == 200
        assert server.manage("sessions").returncode == 0  # a command calls the server with the local credential
        with http.stream("POST", "/v1/chat/completions", headers={"X-Request-ID": "rid-stream"},
                         json={**chat, "stream": True}) as stream:  # fmt: skip
            assert sse_events(stream)[-1] == "[DONE]"
            responses["rid-stream"] = stream
        send("rid-404", "GET", "/no/such/route")
        send("rid-413", "POST", "/v1/chat/completions", content=b"x" * (BODY_LIMIT + 1),
             headers={"Content-Type": "application/json"})  # fmt: skip
        send("rid-preflight", "OPTIONS", "/v1/chat/completions")
        send("rid-ui", "GET", "/ui/")
        send("rid-static", "GET", "/ui/static/admin_ui/ui.css")
        send("bad id with spaces", "GET", "/v1/models")
        attach = send("rid-attach", "POST", "/api/weights/attach", headers=bearer(trainer))
        attachment_id = attach.json()["data"]["attachment_id"]
        holder = {**bearer(trainer), "X-miLLM-Attachment": attachment_id}
        assert send("rid-heartbeat", "POST", "/api/weights/heartbeat", headers=holder).status_code == 200
        assert send("rid-detach", "POST", "/api/weights/detach", headers=holder).status_code == 200
        long_chat = {**chat, "max_tokens": 400, "ignore_eos": True}
        kill_the_worker_under(server, http, operator, lambda: send("rid-500", "POST", "/v1/chat/completions",
                                                                  json=long_chat))  # fmt: skip
        send("rid-unload", "POST", "/admin/models/unload", headers=bearer(operator), json={"name": "stories"})
        assert send("rid-on-demand", "POST", "/v1/chat/completions", json=chat).status_code == 200  # catalogued
        send("rid-last-unload", "POST", "/admin/models/unload", headers=bearer(operator), json={"name": "stories"})
    audit = list(AuditEvent.objects.order_by("id"))
    local_credential = server.run_file()["admin_secret"]
    server.stop()
    return Run(responses, server.log(), audit, operator, trainer, attachment_id, local_credential)


def kill_the_worker_under(server, http: httpx.Client, operator: str, request) -> None:
    """Sends `request` on a thread, kills the worker once it decodes (its answer: 500), and waits until the restarted
    worker serves the model again."""
    [pid] = server.worker_pids()
    thread = threading.Thread(target=request)
    thread.start()
    admin = bearer(operator)
    wait_for(lambda: http.get("/admin/models", headers=admin).json()["data"][0].get("live", {}).get("running") == 1,
             timeout=60, interval=0.01)  # fmt: skip
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    wait_for(lambda: http.get("/v1/models").json()["data"] and http.get("/admin/models", headers=admin).json()
             ["data"][0]["state"] == "ready", timeout=120, interval=0.2)  # fmt: skip


@pytest.fixture(scope="module")
def run(start_server, stories_hf_dir) -> Run:
    return full_run(start_server, stories_hf_dir)


@pytest.fixture(scope="module")
def sensitive_run(start_server, stories_hf_dir) -> Run:
    return full_run(start_server, stories_hf_dir, PANTHEON_LOG_SENSITIVE="true")


def test_every_response_carries_the_clients_request_id(run):
    statuses = {request_id: response.status_code for request_id, response in run.responses.items()}
    assert statuses == {
        "rid-load": 200, "rid-chat": 200, "rid-embed": 200, "rid-stream": 200, "rid-404": 404, "rid-413": 413,
        "rid-preflight": 200, "rid-ui": 302, "rid-static": 200,
        "bad id with spaces": 200, "rid-attach": 200, "rid-heartbeat": 200, "rid-detach": 200, "rid-unload": 200,
        "rid-500": 500, "rid-on-demand": 200, "rid-last-unload": 200,
    }  # fmt: skip
    for request_id, response in run.responses.items():
        if request_id != "bad id with spaces":
            assert response.headers.get_list("X-Request-ID") == [request_id], request_id
    # an id unsafe in a log line is replaced by one the server makes
    assert re.fullmatch(r"[0-9a-f]{32}", run.responses["bad id with spaces"].headers["X-Request-ID"])


def test_the_log_lines_of_a_request_are_json_and_carry_its_id(run):
    for request_id in run.responses:
        if request_id == "bad id with spaces":
            continue
        lines = run.lines_of(request_id)
        assert lines and all(line["request_id"] == request_id for line in lines), (request_id, lines)
        assert {"time", "level", "logger", "message"} <= lines[0].keys()
        access = [line for line in lines if line["logger"] == "pantheon.access"]
        assert len(access) == 1 and str(run.responses[request_id].status_code) in access[0]["message"], lines
    [django_line, _] = run.lines_of("rid-404")  # Django's own line about the request carries it too
    assert django_line["logger"] == "django.request" and "request" not in django_line
    # the generation cut short by the worker's death: Django's error line for the 500 is the request's
    assert ("ERROR", "django.request") in [(line["level"], line["logger"]) for line in run.lines_of("rid-500")]


@pytest.mark.parametrize("request_id", ["rid-chat", "rid-stream"])
def test_the_workers_lines_about_a_sequence_carry_its_request_id(run, request_id):
    [line] = [line for line in run.lines_of(request_id) if line["logger"] == "pantheon.worker.sequences"]
    assert line["model"] == "stories" and line["sequence"].startswith("chatcmpl-")
    assert "finished" in line["message"] and "completion 8 tokens" in line["message"]


def test_the_workers_line_about_an_embedding_call_carries_its_request_id(run):
    [line] = [line for line in run.lines_of("rid-embed") if line["logger"] == "pantheon.worker.sequences"]
    assert line["model"] == "stories" and "embedding call" in line["message"] and "2 inputs" in line["message"]


def test_audit_events_record_the_request_id(run):
    by_id = {event.request_id: (event.operation, event.actor_label) for event in run.audit}
    assert by_id["rid-load"] == ("model_load", "ops") and by_id["rid-unload"] == ("model_unload", "ops")
    assert by_id["rid-attach"] == ("weights_attach", "trainer") and by_id["rid-detach"] == ("weights_detach", "trainer")
    # the load a /v1 request started is the system's own, and still that request's
    assert by_id["rid-on-demand"] == ("model_load", "on_demand")


def test_no_token_prompt_or_attachment_id_is_logged(run):
    for secret in (run.operator_token, run.trainer_token, run.local_credential, PROMPT_TEXT, run.attachment_id):
        assert secret not in run.log


def test_the_debug_setting_logs_the_prompt_and_attachment_id_but_never_a_token(sensitive_run):
    assert PROMPT_TEXT in sensitive_run.log and sensitive_run.attachment_id in sensitive_run.log
    [prompt_line] = [line for line in sensitive_run.lines_of("rid-chat") if PROMPT_TEXT in line["message"]]
    assert prompt_line["logger"] == "pantheon.generation"
    for secret in (sensitive_run.operator_token, sensitive_run.trainer_token, sensitive_run.local_credential):
        assert secret not in sensitive_run.log
