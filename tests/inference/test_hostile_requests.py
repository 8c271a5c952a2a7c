"""One request can only fail itself: hostile or broken requests against a running server get their own 4xx (or a
retryable 503), and the server, its workers and the generations of others carry on.

Two servers: the module's default one, and one with a 1 MiB body limit (PANTHEON_MAX_BODY_BYTES).
"""

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest

from inference.api.serializers import MAX_JSON_DEPTH
from pantheon_site.asgi import application
from pantheon_site.models import AuditEvent
from tests.inference.serving import operator_client, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SMALL_LIMIT = 1 << 20
HELLO = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
STORY = {"messages": [{"role": "user", "content": "Once upon a time"}], "temperature": 0, "max_tokens": 400}


@pytest.fixture(scope="module")
def server(start_server):
    # A worker silent for 3 s is declared dead (the default is 10 s), so that a request which stalls the worker's loop
    # for seconds (tokenizing 10 MB in one go takes about 10 s here) shows up as a restart even on a faster machine.
    return start_server(PANTHEON_WORKER_HEARTBEAT_TIMEOUT_S="3")


@pytest.fixture(scope="module")
def small_body_server(start_server):
    return start_server(PANTHEON_MAX_BODY_BYTES=str(SMALL_LIMIT))


@pytest.fixture
def small_api(small_body_server, operator_token):
    """An operator's client of the small-limit server; unloads whatever the test loaded."""
    with operator_client(small_body_server, operator_token) as client:
        yield client


def load_stories(client: httpx.Client, path) -> None:
    """Serves stories260K as "stories", once the worker is up (it may still be restarting after a test before)."""
    body = {"path": str(path), "name": "stories", "max_concurrent": 8}

    def loaded() -> bool:
        response = client.post("/admin/models/load", json=body)
        if response.status_code == 400 and "no worker runs" in response.text:
            return False
        assert response.status_code == 200, response.text
        return True

    wait_for(loaded, timeout=120, interval=0.2)


def assert_error(response: httpx.Response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["access-control-allow-origin"] == "*"
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] is None and error["message"]
    return error


def chunked(body: bytes, size: int = 64 * 1024):
    """`body` as a generator: httpx sends it with Transfer-Encoding: chunked and no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


def nested(depth: int, leaf=None):
    """`depth` lists inside one another around `leaf` (built without recursion)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- the body limit -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_limit_is_413_and_the_server_serves_on(small_api, stories_gguf_path, framing):
    load_stories(small_api, stories_gguf_path)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 * SMALL_LIMIT)}]}).encode()
    not_json = b"{" * (2 * SMALL_LIMIT)  # refused for its size before anyone tries to parse it
    for body in (big, not_json):
        content = body if framing == "content-length" else chunked(body)
        response = small_api.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
        sent_chunked = response.request.headers.get("transfer-encoding") == "chunked"
        assert sent_chunked == (framing == "chunked") and sent_chunked != ("content-length" in response.request.headers)
        error = assert_error(response, 413, "invalid_request_error")
        assert str(SMALL_LIMIT) in error["message"]
    # An operator route is refused the same way, before authentication or parsing.
    response = small_api.post("/admin/models/load", content=big, headers={"Authorization": "Bearer nobody"})
    assert_error(response, 413, "invalid_request_error")

    # The server serves on; a small body sent the same way passes the limit.
    small = json.dumps(HELLO).encode()
    content = small if framing == "content-length" else chunked(small, size=8)
    response = small_api.post("/v1/chat/completions", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"]


def asgi_post(headers: list[tuple[bytes, bytes]]) -> dict:
    path = "/v1/chat/completions"
    scope = dict(type="http", http_version="1.1", method="POST", scheme="http", path=path, raw_path=path.encode())
    return {**scope, "query_string": b"", "root_path": "", "headers": [(b"host", b"testserver"), *headers]}


@pytest.mark.parametrize("declared", [True, False])
async def test_the_limit_reads_no_further_than_it_must(settings, declared):
    """In process, with the application daphne serves: a declared length over the limit is refused without reading
    the body; a chunked body is read only until it passes the limit."""
    settings.PANTHEON_MAX_BODY_BYTES = 100
    pulled = []

    async def receive():  # ten chunks of 40 bytes, then (as a server does) nothing until the client goes
        if len(pulled) == 10:
            await asyncio.Event().wait()
        pulled.append({"type": "http.request", "body": b"x" * 40, "more_body": len(pulled) < 9})
        return pulled[-1]

    sent = []

    async def send(message):
        sent.append(message)

    headers = [(b"content-length", b"400")] if declared else [(b"transfer-encoding", b"chunked")]
    await application(asgi_post(headers), receive, send)
    assert len(pulled) == (0 if declared else 3)  # 40, 80, 120 bytes: the third passes the limit
    start, body = sent
    assert start["status"] == 413 and (b"access-control-allow-origin", b"*") in start["headers"]
    error = json.loads(body["body"])["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None and "100 bytes" in error["message"]


# -- nesting ------------------------------------------------------------------------------------------------------


def deep_bodies():
    yield "100000 deep", ('{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}").encode()
    deep_content = [{"role": "user", "content": nested(900, "hi")}]
    yield "content 900 deep", json.dumps({**HELLO, "messages": deep_content}).encode()
    tool = {"type": "function", "function": {"name": "f", "parameters": nested(900, {})}}
    yield "tools 900 deep", json.dumps({**HELLO, "tools": [tool]}).encode()
    yield "tool_choice 900 deep", json.dumps({**HELLO, "tool_choice": nested(900, "auto")}).encode()
    replay = {"role": "assistant", "content": "", "tool_calls": [{"function": nested(900)}]}
    yield "tool_calls 900 deep", json.dumps({**HELLO, "messages": [replay, *HELLO["messages"]]}).encode()


@pytest.mark.parametrize(("name", "body"), list(deep_bodies()), ids=[name for name, _ in deep_bodies()])
def test_deeply_nested_json_is_400_and_the_server_serves_on(server, api, stories_gguf_path, name, body):
    load_stories(api, stories_gguf_path)
    [pid] = server.worker_pids()
    response = api.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(response, 400, "invalid_request_error")
    assert api.post("/v1/chat/completions", json=HELLO).status_code == 200
    assert server.worker_pids() == [pid]


def test_nesting_up_to_the_limit_is_accepted(api, stories_gguf_path):
    load_stories(api, stories_gguf_path)
    parameters = {"type": "object", "properties": {}}
    for _ in range(10):  # a tool schema ten objects deep
        parameters = {"type": "object", "properties": {"inner": parameters}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    # validated in full, then left out of the prompt ("none"): stories260K's 512-token window has no room for it
    response = api.post("/v1/chat/completions", json={**HELLO, "tools": [tool], "tool_choice": "none"})
    assert response.status_code == 200, response.text
    # The body is one level; a field no route reads (so ignored once parsed) makes up the rest.
    for depth, status in ((MAX_JSON_DEPTH, 200), (MAX_JSON_DEPTH + 1, 400)):
        response = api.post("/v1/chat/completions", json={**HELLO, "user_data": nested(depth - 1, "hi")})
        assert response.status_code == status, response.text


# -- one huge prompt among running streams ------------------------------------------------------------------------


def delta_text(event) -> str:
    """The content a parsed SSE event carries ("" for [DONE], errors, the role chunk and the closing chunk)."""
    if not isinstance(event, dict) or not event.get("choices"):
        return ""
    return event["choices"][0]["delta"].get("content") or ""


TEN_MB = "Once upon a time there was a cat. " * 300_000
USER_AND_LONG_ASSISTANT_TURN = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": TEN_MB}]
HUGE_REQUESTS = {  # each holds 10 MB of text that cannot fit stories260K's window, where a route takes text
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEN_MB}]}),
    "chat, an assistant turn": ("/v1/chat/completions", {"messages": USER_AND_LONG_ASSISTANT_TURN}),
    "chat, tools": (
        "/v1/chat/completions",
        {**HELLO, "tools": [{"type": "function", "function": {"name": "tell", "description": TEN_MB}}]},
    ),
    "completions, a list of prompts": ("/v1/completions", {"prompt": ["Hi", TEN_MB]}),
    "embeddings": ("/v1/embeddings", {"input": TEN_MB}),
    "embeddings, a list of inputs": ("/v1/embeddings", {"input": ["Hi", TEN_MB]}),
    "responses, an assistant item": ("/v1/responses", {"input": USER_AND_LONG_ASSISTANT_TURN}),
}


@pytest.mark.parametrize("route, body", HUGE_REQUESTS.values(), ids=HUGE_REQUESTS.keys())
def test_a_10mb_request_fails_alone_while_other_streams_decode(server, api, stories_gguf_path, route, body):
    """Tokenizing 10 MB on the worker's loop would stall it past the 3 s heartbeat timeout: the worker would be
    restarted and the streams cut. Text that cannot fit is refused untokenized, other long text is tokenized beside
    the loop (then refused by its count)."""
    load_stories(api, stories_gguf_path)
    [pid] = server.worker_pids()
    decoding = [threading.Event() for _ in range(4)]
    statuses: list[int | None] = [None] * 4
    events: list[list] = [[] for _ in range(4)]
    failures: list[BaseException] = []

    def stream(i: int) -> None:
        try:
            with httpx.Client(base_url=server.url, timeout=120) as client:
                with client.stream("POST", "/v1/chat/completions", json={**STORY, "stream": True}) as response:
                    statuses[i] = response.status_code
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            payload = line[len("data: ") :]
                            events[i].append(payload if payload == "[DONE]" else json.loads(payload))
                            if delta_text(events[i][-1]):
                                decoding[i].set()
        except Exception as exc:
            failures.append(exc)
        finally:
            decoding[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(event.is_set() for event in decoding), timeout=120)  # every stream produced a token

    with httpx.Client(base_url=server.url, timeout=300) as client:
        response = client.post(route, json=body)
    error = assert_error(response, 422, "context_over_budget")
    assert "context window" in error["message"]

    for thread in threads:
        thread.join()
    assert not failures, failures
    assert statuses == [200] * 4
    for stream_events in events:
        assert stream_events[-1] == "[DONE]"
        assert not [e for e in stream_events if isinstance(e, dict) and "error" in e]
        assert "".join(delta_text(e) for e in stream_events)
        closing = [e for e in stream_events if isinstance(e, dict) and e.get("choices")][-1]
        assert closing["choices"][0]["finish_reason"] in ("stop", "length")

    # The worker was not restarted, and no crash was audited; the model serves on.
    assert server.worker_pids() == [pid]
    assert not AuditEvent.objects.filter(operation="worker_crash").exists()
    assert api.post("/v1/chat/completions", json=HELLO).status_code == 200


def test_a_small_chat_is_answered_while_a_long_conversation_is_tokenized(server, api, stories_gguf_path):
    """A conversation whose text may fit (an assistant turn's text can be cut by a template) is tokenized beside the
    loop: a small chat sent after it gets its answer first."""
    load_stories(api, stories_gguf_path)
    [pid] = server.worker_pids()
    answered: list[str] = []

    def long_conversation() -> None:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            response = client.post("/v1/chat/completions", json={"messages": USER_AND_LONG_ASSISTANT_TURN})
        answered.append(f"long {response.status_code}")

    thread = threading.Thread(target=long_conversation)
    thread.start()
    time.sleep(1)  # its 10 MB reach the worker (a small chat sent before them would be answered first anyway)
    response = api.post("/v1/chat/completions", json=HELLO)
    answered.append(f"small {response.status_code}")
    thread.join()
    assert answered == ["small 200", "long 422"]
    assert server.worker_pids() == [pid]


# -- requests while a killed worker restarts ----------------------------------------------------------------------


def test_requests_while_a_killed_worker_restarts_get_200_or_503_with_retry_after(server, api, stories_gguf_path):
    load_stories(api, stories_gguf_path)
    assert api.post("/v1/chat/completions", json=HELLO).status_code == 200
    [pid] = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    answers: list[httpx.Response] = []

    def served() -> bool:
        answers.append(api.post("/v1/chat/completions", json=HELLO))
        return answers[-1].status_code == 200

    wait_for(served, timeout=180, interval=0.05)  # a safety net only: the model must come back at some point
    for response in answers[:-1]:
        assert_error(response, 503, response.json()["error"]["type"])
        assert int(response.headers["retry-after"]) >= 0
    assert [p for p in server.worker_pids() if p != pid]
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["stories"]
