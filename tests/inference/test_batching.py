"""Continuous batching as a client sees it, against a running server (stories260K, float32 on the CPU worker):
greedy output does not depend on what else is in the batch; a model decodes at most its max_concurrent requests at
once and queues the rest; a full queue or a long wait is 429 with Retry-After; a client that leaves frees its slot
at once; a generation that reaches the window ends with "length"; n > 1 choices; stop strings never leak."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pantheon_site.tokens import do_create_token
from tests.inference.serving import bearer, sse_events, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NO_EOS = {"2": -100}  # stories260K's EOS never sampled: a generation runs to max_tokens or the window
PROMPTS = [
    "Hi",
    "Tell me a story.",
    "Once upon a time there was a little girl named Lily.",
    "The dog ran to the park and saw a big red ball. He wanted to play with it all day long.",
    "Tom",
    "What did the cat see in the garden?",
    "Sam and his mom went to the store to buy some apples and a big cake for the party.",
    "A bird sang.",
]


@pytest.fixture(scope="module")
def server(start_server, stories_hf_dir):
    """One server with three models: "wide" (8 slots), "four" (4 slots) and "short" (a 64-token window)."""
    server = start_server()
    token = do_create_token("operator", "batching-loader")[1]
    with httpx.Client(base_url=server.url, timeout=120, headers=bearer(token)) as api:
        for name, options in [("wide", {"max_concurrent": 8}), ("four", {"max_concurrent": 4}),
                              ("short", {"max_concurrent": 2, "ctx_cap": 64})]:  # fmt: skip
            response = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": name, **options})
            assert response.status_code == 200, response.text
    return server


@pytest.fixture
def api(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def chat(api, content, model="wide", **fields):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def live(server, token, name):
    """The scheduler's occupancy of model `name` (running, waiting, slots_used...) from GET /admin/models."""
    rows = httpx.get(server.url + "/admin/models", headers=bearer(token), timeout=30).json()["data"]
    return next(row for row in rows if row["id"] == name)["live"]


def stream(server, body):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            return response.status_code, sse_events(response)


def streamed_text(events, index=0):
    return "".join(
        e["choices"][0]["delta"].get("content", "")
        for e in events
        if isinstance(e, dict) and e.get("choices") and e["choices"][0]["index"] == index
    )


def test_models_report_the_served_concurrency_and_window(api, server, operator_token):
    models = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    assert (models["four"]["max_concurrent"], models["four"]["context_window"]) == (4, 512)
    assert (models["short"]["max_concurrent"], models["short"]["context_window"]) == (2, 64)
    rows = {r["id"]: r for r in api.get("/admin/models", headers=bearer(operator_token)).json()["data"]}
    assert rows["four"]["max_concurrent"] == rows["four"]["max_concurrent_configured"] == 4
    assert rows["short"]["context_window"] == rows["short"]["context_window_configured"] == 64
    assert rows["wide"]["live"]["slots_total"] == 8


def test_greedy_output_is_the_same_alone_and_in_a_batch_of_eight(api):
    fields = {"max_tokens": 40, "logprobs": True}
    alone = [chat(api, prompt, **fields)["choices"][0] for prompt in PROMPTS]
    barrier = threading.Barrier(len(PROMPTS))

    def together(prompt):
        barrier.wait()
        return chat(api, prompt, **fields)["choices"][0]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        batched = list(pool.map(together, PROMPTS))
    for one, many in zip(alone, batched, strict=True):
        assert many["message"]["content"] == one["message"]["content"]
        assert [t["token"] for t in many["logprobs"]["content"]] == [t["token"] for t in one["logprobs"]["content"]]
        assert many["finish_reason"] == one["finish_reason"]


def test_sixteen_streams_on_four_slots_all_complete_never_more_than_four_at_once(server, operator_token):
    body = {"model": "four", "messages": [{"content": "Hi"}], "max_tokens": 150, "logit_bias": NO_EOS}
    samples, done = [], threading.Event()

    def poll():
        while not done.is_set():
            samples.append(live(server, operator_token, "four"))
            time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: stream(server, {**body, "seed": i, "temperature": 1}), range(16)))
    finally:
        done.set()
        poller.join()
    for status, events in results:
        assert status == 200
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert max(s["running"] for s in samples) == 4  # the batch filled up, and never went past max_concurrent
    assert max(s["slots_used"] for s in samples) <= 4
    assert max(s["waiting"] for s in samples) > 0  # the other clients queued rather than being refused


def test_a_client_that_leaves_mid_stream_frees_its_slot_at_once(api, server, operator_token):
    body = {"model": "four", "messages": [{"content": "Hi"}], "max_tokens": 500, "logit_bias": NO_EOS}
    started = time.monotonic()
    chat(api, "Hi", model="four", max_tokens=500, logit_bias=NO_EOS)
    full = time.monotonic() - started  # how long the whole generation takes
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            lines = response.iter_lines()
            for _ in range(3):
                next(lines)
            assert live(server, operator_token, "four")["slots_used"] == 1
            response.close()
            closed_at = time.monotonic()
    wait_for(lambda: live(server, operator_token, "four")["slots_used"] == 0, timeout=5, interval=0.005)
    assert time.monotonic() - closed_at < full / 2


def test_a_non_streaming_client_that_leaves_frees_its_slot_at_once(api, server, operator_token):
    body = {"model": "four", "messages": [{"content": "Hi"}], "max_tokens": 500, "logit_bias": NO_EOS}
    started = time.monotonic()
    chat(api, "Hi", model="four", max_tokens=500, logit_bias=NO_EOS)
    full = time.monotonic() - started
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=full / 5))
    left_at = time.monotonic()
    wait_for(lambda: live(server, operator_token, "four")["slots_used"] == 0, timeout=5, interval=0.005)
    assert time.monotonic() - left_at < full / 2


def test_a_generation_that_reaches_the_window_ends_with_length(api, server):
    body = chat(api, "Hi", model="short", max_tokens=1000, logit_bias=NO_EOS)
    usage = body["usage"]
    assert body["choices"][0]["finish_reason"] == "length"
    assert usage["kv_cap"] == 64 and usage["prompt_tokens"] + usage["completion_tokens"] == 64
    status, events = stream(server, {"model": "short", "messages": [{"content": "Hi"}], "max_tokens": 1000,
                                     "logit_bias": NO_EOS, "stream_options": {"include_usage": True}})  # fmt: skip
    assert status == 200 and events[-1] == "[DONE]"
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    streamed = events[-2]["usage"]
    # the same prompt again: its full blocks come from the prefix cache
    assert streamed.pop("prompt_tokens_details")["cached_tokens"] == usage["prompt_tokens"] // 16 * 16
    assert streamed == {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def test_n_choices_are_separate_decodes_with_seed_plus_i(api, server):
    fields = {"temperature": 1.0, "max_tokens": 12, "seed": 7}
    body = chat(api, "Tell me a story.", n=3, **fields)
    singles = [chat(api, "Tell me a story.", **{**fields, "seed": 7 + i}) for i in range(3)]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == [s["choices"][0]["message"]["content"]
                                                                  for s in singles]  # fmt: skip
    assert len({c["message"]["content"] for c in body["choices"]}) > 1
    usage = body["usage"]
    assert usage["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"]  # the prompt is counted once
    assert usage["completion_tokens"] == sum(s["usage"]["completion_tokens"] for s in singles)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "n_status" not in body

    status, events = stream(server, {"model": "wide", "messages": [{"content": "Tell me a story."}], "n": 3,
                                     "stream_options": {"include_usage": True}, **fields})  # fmt: skip
    assert status == 200 and events[-1] == "[DONE]"
    indexes = [e["choices"][0]["index"] for e in events[:-2]]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2}  # one choice after another
    for i in range(3):
        chunks = [e["choices"][0] for e in events[:-2] if e["choices"][0]["index"] == i]
        assert chunks[0]["delta"] == {"role": "assistant"} and chunks[-1]["finish_reason"] is not None
        assert streamed_text(events, i) == body["choices"][i]["message"]["content"]
    assert events[-2]["usage"]["completion_tokens"] == usage["completion_tokens"]


def test_n_above_eight_is_capped_and_says_so(api):
    body = chat(api, "Hi", n=10, max_tokens=2)
    assert [c["index"] for c in body["choices"]] == list(range(8))
    assert body["n_status"] == "capped_to_8"


def test_a_stop_string_never_leaks_even_in_part(api, server):
    text = chat(api, "Once upon a time", model="four", max_tokens=60, logit_bias=NO_EOS)["choices"][0]["message"]
    text = text["content"]
    stop = text[len(text) // 2 : len(text) // 2 + 6]  # from mid-text: spans token boundaries
    expected = text[: text.index(stop)]
    fields = {"model": "four", "messages": [{"content": "Once upon a time"}], "temperature": 0, "max_tokens": 60,
              "logit_bias": NO_EOS, "stop": [stop]}  # fmt: skip
    status, events = stream(server, fields)
    assert status == 200 and streamed_text(events) == expected
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert api.post("/v1/chat/completions", json=fields).json()["choices"][0]["message"]["content"] == expected


def test_a_full_queue_and_a_long_wait_are_429_with_retry_after(start_server, stories_hf_dir, operator_token):
    # One slot, two queue places, and a queue wait far shorter than one 500-token generation.
    server = start_server(PANTHEON_QUEUE_DEPTH="2", PANTHEON_QUEUE_WAIT_S="0.1")
    with httpx.Client(base_url=server.url, timeout=120) as api:
        loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "one", "max_concurrent": 1},
                          headers=bearer(operator_token))  # fmt: skip
        assert loaded.status_code == 200, loaded.text
        body = {"messages": [{"content": "Hi"}], "max_tokens": 500, "logit_bias": NO_EOS}
        barrier = threading.Barrier(8)

        def send(_):
            barrier.wait()
            return api.post("/v1/chat/completions", json=body)

        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(send, range(8)))
    refused = [r for r in responses if r.status_code == 429]
    assert sum(r.status_code == 200 for r in responses) >= 1 and len(refused) >= 5
    assert {r.status_code for r in responses} == {200, 429}
    for response in refused:
        assert response.json()["error"]["type"] == "server_busy" and int(response.headers["retry-after"]) >= 1
    messages = [r.json()["error"]["message"] for r in refused]
    assert any("busy" in m for m in messages)  # refused at once: the queue was full
    assert any("within 0.1 s" in m for m in messages)  # waited in the queue past PANTHEON_QUEUE_WAIT_S
