"""GET /metrics on a real server with a real worker: a scrape before and after known requests, and every counter and
histogram moved by exactly what those requests did (their usage, their number, the one refusal, the one load); the
workers' gauges are in the same scrape, and a dead worker's gauges leave it."""

from __future__ import annotations

import json
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.serving import bearer, sse_events, wait_for
from tests.weights.weights_calls import Holder, new_token

pytestmark = pytest.mark.django_db(transaction=True)

ROUTE = "/v1/chat/completions"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "pantheon.json"


def scrape(api: httpx.Client) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape (from loopback, without a token), by name and labels."""
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """A sample's value; 0 for one not (yet) exported."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def api(server, operator_token, stories_hf_dir):
    """A client of the server with stories260K served as "stories"; whatever the test loaded is unloaded after."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
        for row in client.get("/admin/models", headers=bearer(operator_token)).json()["data"]:
            client.post("/admin/models/unload", json={"name": row["id"]}, headers=bearer(operator_token))


def load_stories(api, operator_token, stories_hf_dir) -> None:
    loaded = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"},
                      headers=bearer(operator_token))  # fmt: skip
    assert loaded.status_code == 200, loaded.text


def test_counters_and_histograms_move_by_exactly_what_the_requests_did(api, operator_token, stories_hf_dir):
    start = scrape(api)
    load_stories(api, operator_token, stories_hf_dir)
    before = scrape(api)
    assert moved(start, before, "pantheon_model_load_seconds_count", model="stories") == 1

    bodies = [{"messages": [{"role": "user", "content": f"Tell me a story number {i}"}], "temperature": 0,
               "max_tokens": 4 + i} for i in range(3)]  # fmt: skip
    usages = []
    for body in bodies:
        response = api.post(ROUTE, json=body)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    stream = {**bodies[0], "stream": True, "stream_options": {"include_usage": True}}
    with api.stream("POST", ROUTE, json=stream) as response:
        assert response.status_code == 200
        events = sse_events(response)
    usages.append(next(e for e in events if isinstance(e, dict) and e.get("usage"))["usage"])
    too_long = {"messages": [{"role": "user", "content": "once upon a time " * 2000}], "max_tokens": 1}
    refused = api.post(ROUTE, json=too_long)
    assert refused.status_code >= 400, refused.text
    after = scrape(api)

    generations = len(usages)
    ok = {"route": ROUTE, "model": "stories", "status": "200"}
    assert moved(before, after, "pantheon_requests_total", **ok) == generations
    assert moved(before, after, "pantheon_requests_total", route=ROUTE, model="stories",
                 status=str(refused.status_code)) == 1  # fmt: skip
    assert moved(before, after, "pantheon_request_duration_seconds_count", route=ROUTE, model="stories") == (
        generations + 1
    )
    assert moved(before, after, "pantheon_refusals_total", model="stories", reason="prompt_too_long") == 1
    assert moved(before, after, "pantheon_prompt_tokens_total", model="stories") == sum(
        u["prompt_tokens"] for u in usages
    )
    assert moved(before, after, "pantheon_completion_tokens_total", model="stories") == sum(
        u["completion_tokens"] for u in usages
    )
    assert moved(before, after, "pantheon_cached_prompt_tokens_total", model="stories") == sum(
        (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages
    )
    assert [u["completion_tokens"] for u in usages] == [4, 5, 6, 4]  # no stop: each ran to its max_tokens
    assert moved(before, after, "pantheon_time_to_first_token_seconds_count", model="stories") == generations
    assert moved(before, after, "pantheon_inter_token_latency_seconds_count", model="stories") == sum(
        u["completion_tokens"] - 1 for u in usages
    )
    assert moved(before, after, "pantheon_queue_wait_seconds_count", model="stories") == generations

    # The worker's gauges: idle again, and the KV pool's blocks all accounted for, before and after.
    for samples in (before, after):
        assert (
            value(samples, "pantheon_kv_blocks_used", model="stories")
            + value(samples, "pantheon_kv_blocks_free", model="stories")
            == value(before, "pantheon_kv_blocks_used", model="stories")
            + value(before, "pantheon_kv_blocks_free", model="stories")
            > 0
        )
        assert ("pantheon_kv_blocks_used", frozenset({"model": "stories"}.items())) in samples
    assert value(after, "pantheon_queue_depth", model="stories") == 0
    assert value(after, "pantheon_sequences_decoding", model="stories") == 0
    assert value(after, "pantheon_weights_state", model="stories", state="clean") == 1

    unloaded = api.post("/admin/models/unload", json={"name": "stories"}, headers=bearer(operator_token))
    assert unloaded.status_code == 200, unloaded.text
    gone = scrape(api)
    assert moved(after, gone, "pantheon_model_unload_seconds_count", model="stories") == 1
    assert value(gone, "pantheon_kv_blocks_free", model="stories") == 0


def test_a_dead_workers_gauges_leave_the_scrape(server, api, operator_token, stories_hf_dir):
    load_stories(api, operator_token, stories_hf_dir)
    before = scrape(api)
    blocks = value(before, "pantheon_kv_blocks_used", model="stories") + value(
        before, "pantheon_kv_blocks_free", model="stories"
    )
    [pid] = server.worker_pids()
    os.kill(pid, signal.SIGKILL)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    wait_for(lambda: api.post(ROUTE, json=body).status_code == 200, timeout=60, interval=0.2)
    after = scrape(api)
    assert moved(before, after, "pantheon_worker_restarts_total", device="cpu") == 1
    # The new worker's pool alone: the dead one's gauges no longer add to it.
    assert (
        value(after, "pantheon_kv_blocks_used", model="stories")
        + value(after, "pantheon_kv_blocks_free", model="stories")
        == blocks
    )
    # Counters of the dead worker still count: its tokens are not forgotten.
    assert value(after, "pantheon_completion_tokens_total", model="stories") >= value(
        before, "pantheon_completion_tokens_total", model="stories"
    )


def test_the_weights_barrier_reports_its_state_commits_and_holds(server, api, operator_token, stories_hf_dir):
    holder = Holder(server, new_token("trainer", "trainer"))  # a trainer token first: the load is attachable
    load_stories(api, operator_token, stories_hf_dir)
    try:
        before = scrape(api)
        holder.attach()
        holder.ok("quiesce")
        holder.ok("commit-begin")
        writing = scrape(api)
        holder.ok("commit-end")
        holder.ok("resume")
        after = scrape(api)
    finally:
        holder.detach()
    state = {s: value(writing, "pantheon_weights_state", model="stories", state=s) for s in ("clean", "writing")}
    assert state == {"clean": 0, "writing": 1}
    assert value(after, "pantheon_weights_state", model="stories", state="clean") == 1
    assert value(after, "pantheon_weights_state", model="stories", state="writing") == 0
    assert moved(before, after, "pantheon_weights_commits_total", model="stories") == 1
    assert moved(before, after, "pantheon_weights_barrier_hold_seconds_count", model="stories") == 1


def queued(samples: dict) -> dict | None:
    """`samples` once a request waits in the queue of "stories"."""
    return samples if value(samples, "pantheon_queue_depth", model="stories") else None


def test_a_request_waiting_for_a_slot_is_in_the_queue_gauge_and_one_more_is_refused(
    start_server, operator_token, stories_hf_dir
):
    """One slot and no queue room beyond it: with the scheduler held (the weights barrier's quiesce, so nothing
    depends on timing), one request waits and shows in pantheon_queue_depth; the next is refused queue_full."""
    server = start_server(PANTHEON_BATCH_SLOTS="1", PANTHEON_QUEUE_DEPTH="0", PANTHEON_QUEUE_WAIT_S="300",
                          WEIGHTS_HOLD_TIMEOUT_S="300")  # fmt: skip
    holder = Holder(server, new_token("trainer", "trainer"))
    body = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 3}
    with httpx.Client(base_url=server.url, timeout=120) as api, ThreadPoolExecutor(1) as pool:
        load_stories(api, operator_token, stories_hf_dir)
        before = scrape(api)
        holder.attach()
        holder.ok("quiesce")
        try:
            waiting = pool.submit(api.post, ROUTE, json=body)
            held = wait_for(lambda: queued(scrape(api)))
            refused = api.post(ROUTE, json=body)
        finally:
            holder.ok("resume")
            holder.detach()
        assert waiting.result().status_code == 200
        after = scrape(api)
    assert value(held, "pantheon_queue_depth", model="stories") == 1
    assert value(held, "pantheon_sequences_decoding", model="stories") == 0
    assert refused.status_code == 429, refused.text
    assert moved(before, after, "pantheon_refusals_total", model="stories", reason="queue_full") == 1
    assert moved(before, after, "pantheon_requests_total", route=ROUTE, model="stories", status="429") == 1
    assert moved(before, after, "pantheon_queue_wait_seconds_count", model="stories") == 1
    assert value(after, "pantheon_queue_depth", model="stories") == 0


def test_every_metric_the_dashboard_draws_is_in_a_real_scrape(api, operator_token, stories_hf_dir):
    """After a load, a generation, a refusal and an unload, every series the dashboard's queries (and its model
    picker) name is exported: the dashboard cannot drift from the code."""
    load_stories(api, operator_token, stories_hf_dir)
    assert api.post(ROUTE, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).status_code == 200
    too_long = {"messages": [{"role": "user", "content": "once upon a time " * 2000}], "max_tokens": 1}
    assert api.post(ROUTE, json=too_long).status_code >= 400
    assert api.post("/admin/models/unload", json={"name": "stories"}, headers=bearer(operator_token)).status_code == 200
    exported = {name for name, _ in scrape(api)}
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    queries += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    named = {name for query in queries for name in re.findall(r"\bpantheon_[a-z_]+\b", query)}
    assert len(named) >= 20
    assert named <= exported, sorted(named - exported)
