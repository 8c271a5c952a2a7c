"""The /api/weights routes over HTTP against a real server and worker: the management envelope, every refusal with
its status, code and reason, the order of the checks with several faults at once, the audit events, which weights
answered (X-miLLM-Model), unsaved commits, checkpoints and their lineage. The timers are in test_weights_timers.py,
a real trainer process in test_weights_trainer.py, the state machine alone in tests/engine/test_weights_barrier.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from inference.engine import kernels
from pantheon_site.models import AuditEvent
from tests.inference.serving import sse_events, wait_for
from tests.inference.session_turns import assistant_message, chat, load, unload
from tests.weights.weights_calls import EOS, Holder, load_attachable, new_token, status, weights_call

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def server(start_server, checkpoint_dir):
    # timers long enough that a test between two calls never meets them (test_weights_timers.py runs them short)
    timers = {"WEIGHTS_COMMIT_WATCHDOG_MS": "30000", "WEIGHTS_HOLD_TIMEOUT_S": "30"}
    return start_server(PANTHEON_CHECKPOINT_DIR=str(checkpoint_dir), **timers)


@pytest.fixture
def holder(server, api, stories_hf_dir):
    """A trainer token, stories260K loaded attachable as "stories", and the trainer's (unattached) holder."""
    holder = Holder(server, load_attachable(api, stories_hf_dir))
    yield holder
    holder.detach()


def greedy(server, model: str = "stories", stream: bool = False, **fields) -> httpx.Response:
    body = {"model": model, "messages": PROMPT, "temperature": 0, "max_tokens": 24, "stream": stream, **fields}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def commit(holder: Holder) -> dict:
    """One write cycle by raw calls, writing nothing: what these tests look at is the bookkeeping (the commit
    count, saves, lineage). A real in-place write is test_weights_trainer.py's."""
    assert holder.ok("quiesce")["weights_state"] == "clean"
    holder.ok("commit-begin")
    end = holder.ok("commit-end")
    holder.ok("resume")
    return end


def test_status_needs_no_token_and_shows_nothing_resident(server):
    data = status(server)
    assert data["attached"] is False and data["resident_model"] is None and data["steps_since_load"] is None
    assert data["weights_state"] == "clean" and data["barrier"] == "serving" and data["pause_unavailable"] is None


def test_an_unknown_weights_route_answers_in_the_management_envelope(server):
    answer = weights_call(server, "nope")
    assert answer.error == (404, "NOT_FOUND", None)


def test_token_checks_come_first_then_attachment_then_holder_then_state(server, holder, api):
    # Several faults at once: every call below is also made with nothing attached, or the wrong holder, or while
    # the weights are not clean; each answers with the first check in the spec's order.
    no_token = weights_call(server, "commit-begin")
    assert no_token.error == (401, "WEIGHTS_UNAUTHORIZED", "token_missing")
    assert no_token.headers["WWW-Authenticate"] == "Bearer"
    assert weights_call(server, "quiesce", "pth_not-a-real-token").error[:2] == (401, "WEIGHTS_UNAUTHORIZED")
    client = new_token("client", "app")
    assert weights_call(server, "attach", client).error == (403, "WEIGHTS_FORBIDDEN", "role_client")
    assert weights_call(server, "clear-stale", holder.token).error == (403, "WEIGHTS_FORBIDDEN", "role_trainer")
    assert weights_call(server, "quiesce", holder.token).error == (409, "NOT_ATTACHED", None)  # no header: not 422
    holder.attach()
    holder.ok("quiesce")
    holder.ok("commit-begin")
    assert weights_call(server, "commit-begin", holder.token, "wrong-id").error == (403, "NOT_ATTACHMENT_HOLDER", None)
    other = new_token("trainer", "other-trainer")
    answer = weights_call(server, "commit-begin", other, holder.attachment_id)
    assert answer.error == (403, "NOT_ATTACHMENT_HOLDER", None)  # the id alone is not enough: the label must match
    assert holder.call("commit-begin").error == (409, "WEIGHTS_NOT_CLEAN", None)
    assert weights_call(server, "commit-end", None, holder.attachment_id).error[1] == "WEIGHTS_UNAUTHORIZED"
    holder.ok("commit-end")
    holder.ok("resume")


def test_every_state_refusal_has_its_status(server, holder):
    holder.attach()
    assert holder.call("commit-begin").error == (409, "NOT_QUIESCED", None)
    assert holder.call("commit-end").error == (409, "NO_OPEN_COMMIT", None)
    assert holder.ok("resume") == {"barrier": "serving", "weights_state": "clean"}  # a no-op while serving
    quiesced = holder.call("quiesce").data
    assert quiesced["held_requests"] == 0
    held_for = datetime.fromisoformat(quiesced["hold_deadline"]) - datetime.fromisoformat(quiesced["quiesced_at"])
    assert held_for.total_seconds() == 30  # the module's WEIGHTS_HOLD_TIMEOUT_S
    assert holder.call("quiesce").error == (409, "ALREADY_QUIESCED", None)
    operator = new_token("operator", "ops-2")
    assert weights_call(server, "clear-stale", operator).error == (409, "ATTACHMENT_NOT_STALE", None)
    second = weights_call(server, "attach", new_token("trainer", "second"))
    assert second.error == (409, "ALREADY_ATTACHED", None)
    assert (
        second.body["error"]["details"]["label"] == "trainer" and second.body["error"]["details"]["state"] == "active"
    )
    holder.ok("commit-begin")
    assert holder.call("save", {"run_id": "r"}).error == (409, "WEIGHTS_NOT_CLEAN", None)
    assert holder.call("resume").error == (409, "WEIGHTS_NOT_CLEAN", "commit_open")
    holder.ok("commit-end")
    assert holder.call("save", {"run_id": "../escape"}).error == (400, "INVALID_REQUEST", None)
    holder.ok("resume")


def test_attach_is_refused_with_nothing_loaded_and_for_models_that_cannot_be_attached(
    server, api, stories_gguf_path, stories_hf_dir
):
    trainer = new_token("trainer", "t")
    assert weights_call(server, "attach", trainer).error == (400, "MODEL_NOT_LOADED", None)
    load(api, stories_gguf_path, "gguf")
    assert weights_call(server, "attach", trainer).error == (400, "NOT_ATTACHABLE", "gguf")
    unload(api, "gguf")
    load(api, stories_hf_dir, "int8", quantize=True)
    assert weights_call(server, "attach", trainer).error == (400, "NOT_ATTACHABLE", "quantized")
    assert status(server)["not_attachable_reason"] == "quantized"


def test_a_load_before_any_trainer_token_is_not_attachable(server, api, stories_hf_dir):
    load(api, stories_hf_dir, "stories")
    trainer = new_token("trainer", "late")
    assert weights_call(server, "attach", trainer).error == (400, "NOT_ATTACHABLE", "allocator")


def test_while_attached_loads_and_unloads_are_refused_and_serving_goes_on(server, api, holder, stories_hf_dir):
    holder.attach()
    assert text_of(greedy(server))
    refused = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "another"})
    assert refused.status_code == 409 and "ALREADY_ATTACHED" in refused.json()["error"]["message"]
    refused = api.post("/admin/models/unload", json={"name": "stories"})
    assert refused.status_code == 409 and "ALREADY_ATTACHED" in refused.json()["error"]["message"]
    holder.detach()
    assert api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "another"}).status_code == 200


def test_every_gated_call_is_audited_with_the_spec_fields_and_no_secret(server, holder):
    holder.attach()
    commit(holder)
    holder.ok("quiesce")
    holder.call("quiesce")  # refused: ALREADY_QUIESCED
    holder.ok("resume")
    weights_call(server, "save")  # no token: audited as weights_save
    weights_call(server, "clear-stale", holder.token)  # a trainer token: refused, with who asked
    attachment_id = holder.attachment_id
    holder.detach()
    events = list(AuditEvent.objects.filter(operation__startswith="weights_").order_by("id"))
    assert [e.operation for e in events] == [
        "weights_attach",
        "weights_quiesce",
        "weights_commit_begin",
        "weights_commit_end",
        "weights_resume",
        "weights_quiesce",
        "weights_quiesce",
        "weights_resume",
        "weights_save",
        "weights_clear_stale",
        "weights_detach",
    ]
    refused = events[6]
    assert (refused.outcome, refused.error_type, refused.actor_label) == ("refused", "ALREADY_QUIESCED", "trainer")
    end = events[3]
    assert end.details["weights_state_before"] == "writing" and end.details["weights_state"] == "clean"
    assert end.details["steps"] == 1 and end.details["elapsed_ms"] >= 0 and end.details["role"] == "trainer"
    token_refusals = events[8:10]
    assert all(len(e.details["attachment"]) == 8 for e in events if e not in token_refusals)
    assert events[8].error_type == "WEIGHTS_UNAUTHORIZED" and events[8].actor_kind == "anonymous"
    assert (events[9].error_type, events[9].actor_label, events[9].details["role"]) == (
        "WEIGHTS_FORBIDDEN",
        "trainer",
        "trainer",
    )
    rows = json.dumps([[e.reason, e.details, e.actor_label, e.model] for e in events])
    assert holder.token not in rows and attachment_id not in rows
    assert holder.token not in server.log() and attachment_id not in server.log()


def test_the_served_weights_are_named_on_every_response(server, holder):
    first = greedy(server)
    assert first.headers["X-miLLM-Model"] == '"stories";origin=model;commits=0'
    holder.attach()
    commit(holder)
    assert greedy(server).headers["X-miLLM-Model"] == '"stories";origin=model;commits=1'
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        timeout=120,
        json={"model": "stories", "messages": PROMPT, "max_tokens": 8, "stream": True},
    ) as response:
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert events[-2]["millm_model"] == '"stories";origin=model;commits=1'
    assert all("millm_model" not in e for e in events[:-2])
    usage = greedy(server, stream=True, stream_options={"include_usage": True})
    chunks = [json.loads(line[6:]) for line in usage.text.splitlines() if line.startswith("data: {")]
    assert "usage" in chunks[-1] and chunks[-1]["millm_model"] == '"stories";origin=model;commits=1'


def test_a_session_exported_before_a_commit_no_longer_restores(server, api, holder):
    """A trainer's commit gives the weights a new version: KV computed on the old weights is refused (409), not
    restored. The same blob restores before the commit, so the version is all that differs."""
    chat(api, "stories", PROMPT, session_id="before")
    exported = api.post("/admin/session/export", json={"name": "stories", "session_id": "before"})
    assert exported.status_code == 200, exported.text
    blob = {"name": "stories", "blob": exported.json()["blob_b64"], "tokens": exported.json()["tokens"]}
    assert api.post("/session/restore", json={**blob, "session_id": "copy"}).status_code == 200
    holder.attach()
    commit(holder)
    refused = api.post("/session/restore", json={**blob, "session_id": "after"})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["type"] == "weights_version_mismatch"


def test_unsaved_commits_refuse_an_auto_load_until_a_save(server, api, holder, stories_hf_dir):
    load(api, stories_hf_dir, "other")
    unload(api, "other")  # catalogued, not loaded: a /v1 request naming it loads it
    holder.attach()
    commit(holder)
    holder.detach()  # detaching keeps the commits in place
    refused = greedy(server, model="other")
    assert refused.status_code == 409
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert refused.json()["error"]["code"] == "weights_unsaved" and "1 unsaved" in refused.json()["error"]["message"]
    assert text_of(greedy(server, model="stories"))  # the resident model itself is served as usual
    holder.attach()
    saved = holder.call("save", {"run_id": "keep"}).data
    holder.detach()
    assert saved["name"] == "stories:keep:step-1"
    assert text_of(greedy(server, model="other"))  # saved: the auto-load goes ahead
    assert text_of(greedy(server, model="stories:keep:step-1"))  # the qualified name routes to the saved weights


def test_save_writes_a_checkpoint_with_its_lineage_and_load_verifies_it(server, holder, checkpoint_dir):
    holder.attach()
    commit(holder)
    first = holder.call("save", {"run_id": "run-a"}).data
    folder = Path(first["path"])
    assert folder == checkpoint_dir / "run-a" / "step-1"
    assert {"model.safetensors", "config.json", "manifest.json", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["name"] == "stories:run-a:step-1" and manifest["parent"] is None
    assert manifest["base_model"] == "stories" and (checkpoint_dir / "run-a" / "latest").resolve() == folder
    assert holder.call("save", {"run_id": "run-a"}).error[:2] == (409, "CHECKPOINT_EXISTS")
    commit(holder)
    second = holder.call("save", {"run_id": "run-a"}).data
    assert second["parent"] == "stories:run-a:step-1" and second["step"] == 2
    state = status(holder.server)
    assert state["served_name"] == "stories:run-a:step-2" and state["origin"] == "checkpoint"
    assert state["last_save"]["checkpoint_sha256"] == second["weights_sha256"] and state["unsaved_commits"] == 0
    chain = weights_call(holder.server, "lineage", method="GET").data["chain"]
    assert [(c["kind"], c["name"]) for c in chain] == [
        ("served", "stories:run-a:step-2"),
        ("checkpoint", "stories:run-a:step-2"),
        ("checkpoint", "stories:run-a:step-1"),
        ("model", "stories"),
    ]
    rows = weights_call(holder.server, "checkpoints", method="GET").data["checkpoints"]
    assert [(r["name"], r["parent"], r["saved_by"]) for r in rows] == [
        ("stories:run-a:step-1", None, "trainer"),
        ("stories:run-a:step-2", "stories:run-a:step-1", "trainer"),
    ]
    assert rows[0]["sha256"] == first["weights_sha256"] and rows[0]["base_model"] == "stories"
    # a checkpoint whose weights no longer match its manifest is refused before anything is touched
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    before = text_of(greedy(holder.server))
    corrupt = weights_call(holder.server, "load", holder.token, body={"checkpoint": "stories:run-a:step-1"})
    assert corrupt.error[:2] == (400, "CHECKPOINT_CORRUPT")
    assert status(holder.server)["weights_state"] == "clean" and text_of(greedy(holder.server)) == before
    assert weights_call(holder.server, "load", holder.token, body={"checkpoint": "nope"}).error[:2] == (
        404,
        "CHECKPOINT_NOT_FOUND",
    )
    loaded = weights_call(holder.server, "load", holder.token, body={"checkpoint": "stories:run-a:step-2"}).data
    assert loaded["served_name"] == "stories:run-a:step-2"
    assert greedy(holder.server).headers["X-miLLM-Model"] == '"stories:run-a:step-2";origin=checkpoint;commits=0'


def test_health_detailed_carries_the_weights_summary(server, holder):
    body = httpx.get(f"{server.url}/api/health/detailed").json()
    assert body["weights"] == {
        "weights_state": "clean",
        "barrier": "serving",
        "attached": False,
        "attachment_state": None,
    }
    holder.attach()
    holder.ok("quiesce")
    body = httpx.get(f"{server.url}/api/health/detailed").json()
    assert body["weights"] == {
        "weights_state": "clean",
        "barrier": "quiesced",
        "attached": True,
        "attachment_state": "active",
    }
    # the worker inherits this process's PANTHEON_KERNELS, so it runs the kernels active here
    assert {"name": "stories", "state": "ready", "kernels": kernels.active_kernels()} in body["models"]
    holder.ok("resume")


def test_status_never_shows_the_attachment_id(server, holder):
    holder.attach()
    text = httpx.get(f"{server.url}/api/weights/status").text
    assert holder.attachment_id not in text and holder.token not in text
    data = status(server)
    assert data["attachment"]["label"] == "trainer" and data["attachment"]["state"] == "active"
    assert data["exports_since_start"] >= 1 and data["attachable"] is True and data["layout"]


def test_quiesce_lets_a_full_batch_finish_and_no_forward_pass_runs_inside_a_commit(server, api, holder):
    holder.attach()
    with ThreadPoolExecutor(6) as pool:
        # EOS banned: each decodes until cut, long enough that the six run together when the quiesce comes
        running = [pool.submit(greedy, server, max_tokens=300, logit_bias={str(EOS): -100}) for _ in range(6)]
        wait_for(lambda: api.get("/admin/models").json()["data"][0]["live"]["running"] == 6)
        quiesced = holder.ok("quiesce")
        finished = [f.result() for f in running]
    assert quiesced["held_requests"] == 0
    assert [r.json()["usage"]["completion_tokens"] for r in finished] == [300] * 6  # all six ran to their end
    steps = status(server)["forward_steps"]
    holder.ok("commit-begin")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(greedy, server)
        wait_for(lambda: status(server)["held_requests"] == 1)
        end = holder.ok("commit-end")
        assert end["forward_steps_during_commit"] == 0 and status(server)["forward_steps"] == steps
        holder.ok("resume")
        assert waiting.result().status_code == 200


def test_a_quiesce_drops_every_cache_computed_on_the_old_weights(server, api, holder):
    story = [{"role": "user", "content": "Once upon a time there was a little dog who liked to run in the park. " * 4}]
    tale = [{"role": "user", "content": "A girl named Lily found a shiny red ball under a big green tree. " * 4}]

    def cached(messages) -> int:
        return chat(api, "stories", messages, max_tokens=4)["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached(tale)
    assert cached(tale) > 0  # the prompt's blocks are reused between requests
    first_turn = chat(api, "stories", story, max_tokens=4, session_id="kept")
    session_turn = story + [assistant_message(first_turn), {"role": "user", "content": "And then?"}]
    holder.attach()
    commit(holder)
    again = chat(api, "stories", session_turn, max_tokens=4, session_id="kept")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the session's KV is gone ...
    # ... and so are the cached prefixes: of the tale, at most the chat template's opening it shares with the turn
    # just computed on the new weights is reused, none of its own blocks from before
    assert cached(tale) < 16
