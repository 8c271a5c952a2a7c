"""Sessions over HTTP against a running server: warm turns whose greedy output equals a cold run, the session key
and its aliases, max_sessions, the block figures of /admin/models, the openai package, `manage.py sessions` and
`release_session`, and the error rows of the session routes (export, restore, release, estimate, watch).

Export, restart and restore (and the blob refusals) are in test_session_restore.py; the idle TTL and the watch's
grace period in test_session_watch.py."""

import base64
import getpass
import json

import httpx
import openai
import pytest

from pantheon_site.models import AuditEvent
from tests.inference.serving import bearer, operator_client, sse_events, wait_for
from tests.inference.session_turns import (
    SYSTEM,
    USER_TURNS,
    answer,
    assistant_message,
    chat,
    converse,
    error_of,
    live_row,
    load,
    sessions_of,
    unload,
)

pytestmark = pytest.mark.django_db(transaction=True)

STORIES_EOS = 2


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    return write_demo_model(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def sessionless(start_server):
    """A server with PANTHEON_SESSIONS off: no model keeps sessions."""
    return start_server(PANTHEON_SESSIONS="false")


@pytest.fixture
def sessionless_api(sessionless, operator_token):
    """An operator's client of the server without sessions; unloads what the test loaded (a fixture, so that it does
    even when the test fails)."""
    with operator_client(sessionless, operator_token) as client:
        yield client


@pytest.fixture(params=["stories-hf", "stories-gguf", "demo"])
def checkpoint(request, stories_hf_dir, stories_gguf_path, demo_dir):
    return {"stories-hf": stories_hf_dir, "stories-gguf": stories_gguf_path, "demo": demo_dir}[request.param]


def demo_eos_ids(demo_dir) -> list[int]:
    added = json.loads((demo_dir / "tokenizer.json").read_text())["added_tokens"]
    return [t["id"] for t in added if t["content"] in ("<|im_end|>", "<|endoftext|>")]


def cold_turn(api: httpx.Client, path, messages: list[dict]) -> dict:
    """The same request without a session, on a freshly loaded copy of the model: nothing can be reused."""
    load(api, path, "cold")
    try:
        body = chat(api, "cold", messages)
    finally:
        unload(api, "cold")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    return body


# -- warm turns ------------------------------------------------------------------------------------------------------


def test_four_turns_in_one_session_are_warm_and_equal_to_cold_runs(api, checkpoint):
    load(api, checkpoint, "m")
    turns = converse(api, "m", USER_TURNS, session_id="conversation-1")
    previous = None
    for _, body in turns:
        usage = body["usage"]
        expected = 0 if previous is None else previous["prompt_tokens"] + previous["completion_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == expected
        assert usage["kv_used"] == usage["prompt_tokens"] + usage["completion_tokens"]  # this session's occupancy
        assert "session_conflict" not in usage
        previous = usage
    for messages, body in turns:
        assert answer(cold_turn(api, checkpoint, messages)) == answer(body)
    [session] = sessions_of(api, "m").values()
    assert (session["session_id"], session["conversations"]) == ("conversation-1", 1)
    assert session["tokens"] == previous["prompt_tokens"] + previous["completion_tokens"]


def test_the_session_key_comes_from_the_body_then_its_aliases_then_the_header(api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    hello = [SYSTEM, {"role": "user", "content": "Hello."}]
    chat(api, "m", hello, headers={"X-Session-Id": "from-header"})
    chat(api, "m", hello, session_id="by-id", prompt_cache_key="not-me", headers={"X-Session-Id": "nor-me"})
    chat(api, "m", hello, prompt_cache_key="by-openai-key", promptCacheKey="not-me-either")
    chat(api, "m", hello, promptCacheKey="by-camel-key", headers={"X-Session-Id": "nor-me-either"})
    chat(api, "m", hello)  # no key: no session
    assert set(sessions_of(api, "m")) == {"from-header", "by-id", "by-openai-key", "by-camel-key"}


@pytest.mark.parametrize(
    ("fields", "headers"),
    [
        ({"session_id": ""}, {}),
        ({"session_id": "x" * 257}, {}),
        ({"session_id": 42}, {}),
        ({"session_id": ["a"]}, {}),
        ({"session_id": "line\nbreak"}, {}),
        ({"prompt_cache_key": ""}, {}),
        ({"promptCacheKey": {"id": "a"}}, {}),
        ({}, {"X-Session-Id": "h" * 300}),
    ],
)
def test_a_malformed_session_key_is_400(server, fields, headers):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **fields}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers)
    assert error_of(response) == (400, "invalid_request_error")


def test_only_the_first_of_n_choices_uses_the_session(api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    [(messages, first)] = converse(api, "m", USER_TURNS[:1], session_id="n2")
    messages = [*messages, assistant_message(first), {"role": "user", "content": USER_TURNS[1]}]
    body = chat(api, "m", messages, session_id="n2", n=2)
    usage = first["usage"]
    assert (
        body["usage"]["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )
    assert sessions_of(api, "m")["n2"]["conversations"] == 1


def test_a_model_without_sessions_serves_a_session_key_as_a_plain_request(sessionless_api, stories_hf_dir):
    api = sessionless_api
    row = load(api, stories_hf_dir, "m")
    assert row["max_sessions"] == api.get("/v1/models").json()["data"][0]["max_sessions"] == 0
    converse(api, "m", USER_TURNS[:2], session_id="ignored")
    assert live_row(api, "m")["sessions"] == 0 and sessions_of(api, "m") == {}


# -- residency -------------------------------------------------------------------------------------------------------


def test_max_sessions_plus_one_ids_the_last_waits_until_one_is_released(api, stories_hf_dir):
    load(api, stories_hf_dir, "cap", max_sessions=2)
    assert api.get("/v1/models").json()["data"][0]["max_sessions"] == 2
    hello = [SYSTEM, {"role": "user", "content": "Hello."}]
    chat(api, "cap", hello, session_id="a")
    chat(api, "cap", hello, session_id="b")
    chat(api, "cap", hello, session_id="a")  # a known id is no new session
    refused = api.post("/v1/chat/completions", json={"model": "cap", "messages": hello, "session_id": "c"})
    assert error_of(refused) == (429, "model_at_session_capacity")
    assert refused.headers["Retry-After"] == "30"
    assert refused.json()["error"]["message"]
    streamed = api.post("/v1/chat/completions", json={"model": "cap", "messages": hello, "session_id": "c",
                                                      "stream": True})  # fmt: skip
    assert error_of(streamed) == (429, "model_at_session_capacity")  # refused before the stream opens
    chat(api, "cap", hello)  # a request without a session is still served
    assert api.post("/session/release", json={"name": "cap", "session_id": "a"}).status_code == 200
    chat(api, "cap", hello, session_id="c")
    assert set(sessions_of(api, "cap")) == {"b", "c"}


def test_admin_rows_show_the_kv_blocks_and_the_sessions(api, stories_hf_dir):
    row = load(api, stories_hf_dir, "m")
    assert row["max_sessions"] == row["max_concurrent"] == 8  # no max_sessions given: the slot count
    live = live_row(api, "m")
    assert live["block_size"] == 16 and live["blocks_total"] > 0
    assert (live["sessions"], live["blocks_pinned"]) == (0, 0)
    assert live["blocks_free"] == live["blocks_total"]
    [(_, body)] = converse(api, "m", USER_TURNS[:1], session_id="pinned")
    held = body["usage"]["kv_used"]
    live = live_row(api, "m")
    assert live["sessions"] == 1
    assert live["blocks_pinned"] == -(-held // 16)  # the conversation's positions, in whole blocks
    assert live["blocks_free"] == live["blocks_total"] - live["blocks_pinned"]
    assert 0 <= live["blocks_cached"] <= live["blocks_free"]
    api.post("/session/release", json={"name": "m", "session_id": "pinned"})
    live = live_row(api, "m")
    assert (live["sessions"], live["blocks_pinned"], live["blocks_free"]) == (0, 0, live["blocks_total"])


def test_the_openai_package_sends_session_keys_its_ways(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0)
    ways = {
        "extra-body": {"extra_body": {"session_id": "sdk-1"}},
        "prompt-cache-key": {"prompt_cache_key": "sdk-2"},
        "header": {"extra_headers": {"X-Session-Id": "sdk-3"}},
    }
    for how in ways.values():
        messages = [SYSTEM, {"role": "user", "content": USER_TURNS[0]}]
        first = sdk.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=8, **how)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": USER_TURNS[1]}]  # fmt: skip
        second = sdk.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=8, **how)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached == first.usage.prompt_tokens + first.usage.completion_tokens
    assert set(sessions_of(api, "m")) == {"sdk-1", "sdk-2", "sdk-3"}


# -- manage.py -------------------------------------------------------------------------------------------------------


def test_manage_py_lists_and_releases_sessions_audited(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    [(_, body)] = converse(api, "m", USER_TURNS[:1], session_id="cli-session")
    listed = server.manage("sessions", "--model", "m")
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if line.startswith("cli-session")]
    tokens = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    assert line.split()[:3] == ["cli-session", "1", str(tokens)] and line.split()[-2:] == ["no", "no"]
    released = server.manage("release_session", "cli-session", "--model", "m")
    assert released.returncode == 0, released.stderr
    assert "Released session 'cli-session'" in released.stdout
    assert sessions_of(api, "m") == {}
    assert "holds no sessions" in server.manage("sessions").stdout  # one model served: it is the default
    events = [(e.operation, e.outcome, e.actor_kind, e.actor_label, e.model, e.details)
              for e in AuditEvent.objects.filter(operation="session_release")]  # fmt: skip
    details = {"session_id": "cli-session", "held": True}
    assert events == [("session_release", "accepted", "cli", getpass.getuser(), "m", details)]
    refused = server.manage("release_session", "x", "--model", "nope")
    assert refused.returncode == 1 and "not loaded" in refused.stderr


# -- the error rows of the session routes ------------------------------------------------------------------------------


def test_export_rows(server, api, operator_token, client_token, demo_dir):
    load(api, demo_dir, "d", ctx_cap=2048)
    export = "/admin/session/export"
    assert error_of(httpx.post(server.url + export, json={"session_id": "s"})) == (401, "unauthorized")
    assert error_of(httpx.post(server.url + export, json={"session_id": "s"}, headers=bearer(client_token))) == (
        403,
        "forbidden",
    )
    assert error_of(api.post(export, content=b"")) == (400, "invalid_request_error")
    assert error_of(api.post(export, content=b"{nope")) == (400, "invalid_request_error")
    assert error_of(api.post(export, json={"name": "d"})) == (400, "invalid_request_error")
    # export reads the body only
    assert error_of(api.post(export, json={"name": "d"}, headers={"X-Session-Id": "s"})) == (
        400,
        "invalid_request_error",
    )
    assert error_of(api.post(export, json={"name": "nope", "session_id": "s"})) == (404, "model_not_found")
    assert error_of(api.post(export, json={"name": "d", "session_id": "never"})) == (404, "session_not_found")

    [(messages, first)] = converse(api, "d", USER_TURNS[:1], session_id="s")
    exported = api.post(export, json={"session_id": "s"})  # one model served: it is the default
    assert exported.status_code == 200, exported.text
    blob = exported.json()
    tokens = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert blob["session_id"] == "s" and blob["n_tok"] == len(blob["tokens"]) == tokens
    assert blob["blob_bytes"] == len(base64.b64decode(blob["blob_b64"])) > 0
    assert isinstance(blob["weights_version"], int)

    # A turn in flight: greedy with the end tokens forbidden runs to max_tokens, far longer than this takes.
    bias = {str(t): -100 for t in demo_eos_ids(demo_dir)}
    turn = {"model": "d", "messages": [*messages, assistant_message(first), {"role": "user", "content": "More."}],
            "session_id": "s", "temperature": 0, "max_tokens": 1800, "logit_bias": bias, "stream": True}  # fmt: skip
    with (
        httpx.Client(timeout=60) as other,
        other.stream("POST", server.url + "/v1/chat/completions", json=turn) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: an abandoned iterator closes the connection, which aborts the turn
        next(lines)
        assert error_of(api.post(export, json={"name": "d", "session_id": "s"})) == (429, "session_busy")
    events = [(e.outcome, e.error_type, e.model) for e in AuditEvent.objects.filter(operation="session_export")]
    assert events[0] == ("refused", "unauthorized", "")
    assert events[-3:] == [
        ("refused", "session_not_found", "d"),
        ("accepted", "", "d"),
        ("refused", "session_busy", "d"),
    ]


def test_restore_rows(server, api, sessionless_api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    restore = "/session/restore"
    good = {"name": "m", "session_id": "r", "blob": base64.b64encode(b"not a blob").decode(), "tokens": [1, 2, 3]}
    assert error_of(api.post(restore, content=b"")) == (400, "invalid_request_error")
    assert error_of(api.post(restore, content=b"[1]")) == (400, "invalid_request_error")
    for missing in ("session_id", "blob", "tokens"):
        body = {k: v for k, v in good.items() if k != missing}
        assert error_of(api.post(restore, json=body)) == (400, "invalid_request_error"), missing
    for tokens in ([], [-1], ["1"], [1.5], [True], "1 2 3", [2**31]):
        assert error_of(api.post(restore, json={**good, "tokens": tokens})) == (400, "invalid_request_error"), tokens
    for blob in ("not base64!", "QUJ", "AAAA" * 3 + "A", "", "ëëëë"):
        assert error_of(api.post(restore, json={**good, "blob": blob})) == (400, "bad_session_blob"), blob
    for blob in (42, None, ["QUJD"]):
        assert error_of(api.post(restore, json={**good, "blob": blob})) == (400, "invalid_request_error"), blob
    assert error_of(api.post(restore, json={**good, "name": "nope"})) == (404, "model_not_found")
    # the session id from the header; a blob that is base64 but no blob is the worker's bad_session_blob
    body = {k: v for k, v in good.items() if k != "session_id"}
    assert error_of(api.post(restore, json=body, headers={"X-Session-Id": "r"})) == (400, "bad_session_blob")
    assert sessions_of(api, "m") == {}
    load(sessionless_api, stories_hf_dir, "m")
    assert error_of(sessionless_api.post(restore, json=good)) == (400, "session_caching_disabled")


def test_release_rows(server, api, sessionless_api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    release = "/session/release"
    assert error_of(api.post(release, content=b"")) == (400, "invalid_request_error")
    assert error_of(api.post(release, content=b"{")) == (400, "invalid_request_error")
    assert error_of(api.post(release, json={"name": "m"})) == (400, "invalid_request_error")
    assert error_of(api.post(release, json={"name": "nope", "session_id": "s"})) == (404, "model_not_found")
    for _ in range(2):  # unknown, then already freed: both 200
        response = api.post(release, json={"name": "m", "session_id": "unknown"})
        assert (response.status_code, response.json()) == (200, {"released": True, "session_id": "unknown"})
    converse(api, "m", USER_TURNS[:1], session_id="by-header")
    response = api.post(release, json={}, headers={"X-Session-Id": "by-header"})  # no name: the default model
    assert (response.status_code, response.json()) == (200, {"released": True, "session_id": "by-header"})
    assert sessions_of(api, "m") == {}
    events = [(e.outcome, e.actor_kind, e.model, e.details.get("session_id"), e.details.get("held"))
              for e in AuditEvent.objects.filter(operation="session_release")]  # fmt: skip
    assert events[-3:] == [("accepted", "anonymous", "m", "unknown", False),
                           ("accepted", "anonymous", "m", "unknown", False),
                           ("accepted", "anonymous", "m", "by-header", True)]  # fmt: skip
    load(sessionless_api, stories_hf_dir, "m")
    response = sessionless_api.post(release, json={"session_id": "any"})
    assert (response.status_code, response.json()) == (200, {"released": True, "session_id": "any"})


def test_estimate_rows(server, api, stories_hf_dir):
    estimate = server.url + "/session/estimate"
    for query in ({}, {"tokens": 0}, {"tokens": -3}, {"tokens": "many"}, {"tokens": 5, "blob_bytes": 0},
                  {"tokens": 5, "upload_bps": "fast"}):  # fmt: skip
        assert error_of(httpx.get(estimate, params=query)) == (400, "invalid_request_error"), query
    # No such model: the fixed fallback rate; with the spec's example numbers, the spec's example answer.
    response = httpx.get(estimate, params={"tokens": 4096, "name": "nope"})
    assert response.json() == {"model": "", "tokens": 4096, "prefill_tok_per_s": 17.0, "cold_reprefill_s": 240.94,
                               "warm_restore_s": 5.391, "blob_bytes_est": 67108864}  # fmt: skip
    given = httpx.get(estimate, params={"tokens": 100, "blob_bytes": 1_000_000, "upload_bps": 1_000_000}).json()
    assert (given["blob_bytes_est"], given["warm_restore_s"]) == (1_000_000, round(1 + 1_000_000 / 3e9, 3))

    load(api, stories_hf_dir, "m")
    converse(api, "m", USER_TURNS[:1], session_id=None)  # one prefill: the model has measured its rate
    measured = httpx.get(estimate, params={"tokens": 1000}).json()  # no name: the one model served
    rate = measured["prefill_tok_per_s"]
    assert measured["model"] == "m" and rate > 0
    assert measured["cold_reprefill_s"] == pytest.approx(1000 / rate, rel=0.01, abs=0.01)


def test_watch_rows(server, api, sessionless, sessionless_api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    watch = server.url + "/session/watch"
    assert error_of(httpx.get(watch)) == (400, "invalid_request_error")
    assert error_of(httpx.get(watch, params={"session_id": ""})) == (400, "invalid_request_error")
    assert error_of(httpx.get(watch, params={"session_id": "w", "name": "nope"})) == (404, "model_not_found")
    converse(api, "m", USER_TURNS[:1], session_id="w")
    with httpx.Client(timeout=30) as client, client.stream("GET", watch, headers={"X-Session-Id": "w"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = response.iter_raw()  # kept: an abandoned iterator closes the connection, which ends the watch
        assert next(chunks) == b": watch established\n\n"
        assert sessions_of(api, "m")["w"]["watched"]
    wait_for(lambda: not sessions_of(api, "m")["w"]["watched"])  # the close was noticed (the grace is 45 s)
    load(sessionless_api, stories_hf_dir, "m")
    refused = httpx.get(sessionless.url + "/session/watch", params={"session_id": "w"})
    assert error_of(refused) == (400, "session_caching_disabled")


def test_session_routes_are_routes(server):
    """Known paths with a method the spec does not list are 404 not_found, like unknown ones."""
    assert error_of(httpx.get(server.url + "/session/release")) == (404, "not_found")
    assert error_of(httpx.post(server.url + "/session/watch")) == (404, "not_found")
    assert error_of(httpx.get(server.url + "/admin/session/export")) == (404, "not_found")


def test_a_stream_can_be_a_session_turn(api, stories_hf_dir):
    load(api, stories_hf_dir, "m")
    [(messages, first)] = converse(api, "m", USER_TURNS[:1], session_id="streamed")
    body = {"model": "m", "messages": [*messages, assistant_message(first), {"role": "user", "content": "More."}],
            "session_id": "streamed", "temperature": 0, "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    events = sse_events(api.post("/v1/chat/completions", json=body))
    usage = events[-2]["usage"]
    total = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == total and "session_conflict" not in usage


def test_without_a_name_a_session_route_needs_a_single_model(server, api, stories_hf_dir, stories_gguf_path):
    load(api, stories_hf_dir, "a")
    converse(api, "a", USER_TURNS[:1], session_id="s")
    load(api, stories_gguf_path, "b")
    assert error_of(api.post("/session/release", json={"session_id": "s"})) == (404, "model_not_found")
    assert error_of(api.post("/admin/session/export", json={"session_id": "s"})) == (404, "model_not_found")
    assert error_of(httpx.get(server.url + "/session/watch", params={"session_id": "s"})) == (404, "model_not_found")
    assert httpx.get(server.url + "/session/estimate", params={"tokens": 1}).json()["model"] == ""
    assert api.post("/admin/session/export", json={"name": "a", "session_id": "s"}).status_code == 200
    assert error_of(api.post("/admin/session/export", json={"name": "b", "session_id": "s"})) == (
        404,
        "session_not_found",
    )


def test_with_client_tokens_required_session_routes_need_one_and_manage_py_still_releases(
    start_server, operator_token, client_token, stories_hf_dir
):
    guarded = start_server(PANTHEON_REQUIRE_CLIENT_TOKENS="true")
    with operator_client(guarded, operator_token) as api:
        load(api, stories_hf_dir, "m")
        converse(api, "m", USER_TURNS[:1], session_id="guarded")
        routes = [
            ("POST", "/session/release", {"json": {"session_id": "x"}}),
            ("POST", "/session/restore", {"json": {"session_id": "x", "blob": "QUJD", "tokens": [1]}}),
            ("GET", "/session/estimate", {"params": {"tokens": 1}}),
            ("GET", "/session/watch", {"params": {"session_id": "x"}}),
        ]
        for method, path, kwargs in routes:
            refused = httpx.request(method, guarded.url + path, **kwargs)
            assert error_of(refused) == (401, "unauthorized"), path
        allowed = httpx.get(guarded.url + "/session/estimate", params={"tokens": 1}, headers=bearer(client_token))
        assert allowed.status_code == 200
        released = guarded.manage("release_session", "guarded")
        assert released.returncode == 0, released.stderr
        assert sessions_of(api, "m") == {}
        event = AuditEvent.objects.filter(operation="session_release", outcome="accepted").get()
        assert (event.actor_kind, event.actor_label) == ("cli", getpass.getuser())
