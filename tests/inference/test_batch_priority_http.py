"""Batch priority against a running server (stories260K): requests sent with `X-Pantheon-Priority: batch` hold at
most PANTHEON_BATCH_SLOT_SHARE of a model's slots, an interactive request that arrives while batch ones wait takes the
next free slot before them, a batch request is refused (503 weights_held) while a trainer holds the weights where an
interactive one waits as before, and another value of the header is 400; which barrier states hold batch work, and
the share of slots the setting gives."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from inference.engine.contract import messages as p
from inference.engine.contract.params import LoadOptions
from inference.engine.contract.weights import WeightsSnapshot
from inference.runtime.client_protocol import ModelPlacement
from inference.services.model_lifecycle import serving_limits
from tests.inference.serving import wait_for
from tests.inference.session_turns import load
from tests.weights.weights_calls import Holder, new_token

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = {"X-Pantheon-Priority": "batch"}
NO_EOS = {"2": -100}  # stories260K's end of sequence, never sampled: a decode runs to max_tokens
WINDOW = 16384  # the long copy's window: a decode to its end outlasts the test by far
HOLD_TIMEOUT_S = 120  # a quiesce stays held for the whole weights test


@pytest.fixture(scope="module")
def server(start_server):
    # No loop detector: a greedy decode of this tiny model soon repeats itself, and must run on until it is let go.
    return start_server(PANTHEON_PREFIX_CACHE_BYTES="0", PANTHEON_REPETITION_LOOP_TOKENS="0",
                        WEIGHTS_HOLD_TIMEOUT_S=str(HOLD_TIMEOUT_S))  # fmt: skip


@pytest.fixture(scope="module")
def long_model(stories_hf_dir, tmp_path_factory):
    """stories260K with a 16K-position window (RoPE has no limit of its own), so a generation can hold its slot
    until the test lets it go: every slot is then decided by the scheduler alone, whatever the machine's speed."""
    path = tmp_path_factory.mktemp("long") / "stories-long"
    shutil.copytree(stories_hf_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": WINDOW}))
    return path


class Stream:
    """One streamed chat completion on a thread of its own: `started` once the server admitted it (its response
    began), `first_token` once content came; it runs until `stop()` closes it (the server aborts it)."""

    def __init__(self, server, pool, name: str, *, headers: dict | None = None):
        self.name = name
        self.started, self.first_token, self.stopping = threading.Event(), threading.Event(), threading.Event()
        self.status: int | None = None
        body = {"model": "long", "messages": [{"role": "user", "content": f"Tell story {name}."}], "stream": True,
                "temperature": 0, "max_tokens": WINDOW - 64, "logit_bias": NO_EOS}  # fmt: skip
        self.done = pool.submit(self._run, server.url, body, headers or {})

    def _run(self, url: str, body: dict, headers: dict) -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                self.status = response.status_code
                self.started.set()
                for line in response.iter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        self.first_token.set()
                    if self.stopping.is_set():
                        return

    def stop(self) -> None:
        self.stopping.set()


def live(api: httpx.Client, name: str) -> dict:
    return next(row for row in api.get("/admin/models").json()["data"] if row["id"] == name)["live"]


def test_batch_requests_hold_their_share_and_an_interactive_arrival_goes_before_waiting_ones(api, server, long_model):
    load(api, long_model, "long", max_concurrent=4, ctx_cap=WINDOW)
    with ThreadPoolExecutor(16) as pool:
        streams = []
        try:
            batch = [Stream(server, pool, f"b{i}", headers=BATCH) for i in range(6)]
            streams += batch
            # (a) half of the 4 slots (PANTHEON_BATCH_SLOT_SHARE 0.5), though the other two are free
            state = wait_for(lambda: (s := live(api, "long"))["batch_waiting"] == 4 and s)
            assert (state["running"], state["batch_running"], state["batch_slots"]) == (2, 2, 2)
            running = wait_for(lambda: [s for s in batch if s.first_token.is_set()] or None)
            assert len([s for s in batch if s.started.is_set()]) == 2
            # the other two slots go to interactive requests
            blockers = [Stream(server, pool, f"i{i}") for i in range(2)]
            streams += blockers
            wait_for(lambda: all(s.first_token.is_set() for s in blockers))
            assert (live(api, "long")["running"], live(api, "long")["batch_waiting"]) == (4, 4)
            # (b) an interactive request arrives while every slot is busy and four batch requests wait before it
            late = Stream(server, pool, "late")
            streams.append(late)
            wait_for(lambda: live(api, "long")["waiting"] == 5)
            running[0].stop()  # a batch request leaves: its slot is the first to free
            wait_for(lambda: late.first_token.is_set() or late.done.done())
            assert late.status == 200 and late.first_token.is_set()
            state = live(api, "long")
            assert (state["running"], state["batch_running"], state["batch_waiting"]) == (4, 1, 4)
            assert not any(s.started.is_set() for s in batch if s not in running)  # none of the waiting ones began
        finally:
            for stream in streams:
                stream.stop()


def test_a_batch_request_waits_out_a_trainers_hold_as_weights_held_and_an_interactive_one_queues(
    api, server, stories_hf_dir
):
    trainer = Holder(server, new_token("trainer", "priority-trainer"))  # before the load: it loads attachable
    load(api, stories_hf_dir, "stories")
    chat = {"model": "stories", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 8}
    trainer.attach(model="stories")
    try:
        trainer.ok("quiesce")
        refused = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=BATCH, timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "weights_held"
        assert refused.headers["Retry-After"] == str(HOLD_TIMEOUT_S)
        embedded = httpx.post(server.url + "/v1/embeddings", json={"model": "stories", "input": "hi"}, headers=BATCH,
                              timeout=60)  # fmt: skip
        assert (embedded.status_code, embedded.json()["error"]["type"]) == (503, "weights_held")
        with ThreadPoolExecutor(1) as pool:
            interactive = pool.submit(httpx.post, server.url + "/v1/chat/completions", json=chat, timeout=60)
            wait_for(lambda: live(api, "stories")["waiting"] == 1)  # held in the queue, as before
            trainer.ok("resume")
            assert interactive.result().status_code == 200
        served = httpx.post(server.url + "/v1/chat/completions", json=chat, headers=BATCH, timeout=60)
        assert served.status_code == 200, served.text
    finally:
        trainer.detach()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_another_priority_is_400_naming_the_header(server, route):
    body = {"messages": [{"role": "user", "content": "Hi"}], "prompt": "Hi", "input": "Hi"}
    response = httpx.post(server.url + route, json=body, headers={"X-Pantheon-Priority": "urgent"}, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "X-Pantheon-Priority" in error["message"]


def test_the_batch_share_of_slots_is_resolved_from_the_setting(settings):
    assert serving_limits(LoadOptions(max_concurrent=4)).batch_slots == 2
    assert serving_limits(LoadOptions(max_concurrent=1)).batch_slots == 1  # at least one slot
    settings.PANTHEON_BATCH_SLOT_SHARE = 0.3
    assert serving_limits(LoadOptions(max_concurrent=8)).batch_slots == 2
    settings.PANTHEON_BATCH_SLOT_SHARE = 1.0
    assert serving_limits(LoadOptions(max_concurrent=8)).batch_slots == 8


def snapshot(**state) -> WeightsSnapshot:
    fields = dict(model="m", served_name="m", base_name="m", origin="model", commits=0, manifest_hash=None,
                  weights_state="clean", barrier="serving", attachment=None, quiesced_at=None, held_requests=None,
                  steps_since_load=0, unsaved_commits=0, last_save=None, commit=None, commit_overran=None,
                  last_hold_timeout_at=None, last_overrun=None, exports_since_start=0, transition=None,
                  attach_refusal=None, layout=None, forward_steps=0)  # fmt: skip
    return WeightsSnapshot(**{**fields, **state})


@pytest.mark.parametrize(
    ("state", "held"),
    [
        ({}, False),
        ({"barrier": "quiesced"}, True),
        ({"barrier": "quiesced", "weights_state": "writing"}, True),
        ({"transition": "load"}, True),  # a weights load pauses serving
        ({"transition": "save"}, False),  # a save serves on
    ],
)
def test_the_weights_hold_batch_work_while_a_trainer_holds_them(state, held):
    placement = ModelPlacement(name="m", device="cpu", state="ready", load=p.Load(request_id="l", name="m", path="/m"))
    assert placement.weights_held() is None  # no barrier reported
    placement.weights = snapshot(**state)
    assert (placement.weights_held() is not None) == held
