"""Export, restart, restore, continue: a session exported from one server and restored into the next (the whole
platform stopped in between, on the same database) continues warm, with the greedy output of an uninterrupted
session. A blob from other weights is 409 weights_version_mismatch; a truncated, altered or other-architecture blob
(or tokens other than the blob's) is 400 bad_session_blob and changes nothing; a restore that would be one session
too many is 429 model_at_session_capacity."""

import base64

import httpx
import pytest

from tests.inference.serving import bearer, operator_client, wait_for
from tests.inference.session_turns import (
    USER_TURNS,
    answer,
    assistant_message,
    chat,
    converse,
    error_of,
    load,
    sessions_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def demo_dirs(tmp_path_factory):
    """Two demo checkpoints of one architecture with different weights (seeds 0 and 1)."""
    from inference.engine.demo_model import write_demo_model  # torch: only the test process imports it

    return [write_demo_model(tmp_path_factory.mktemp(f"demo-{seed}"), seed=seed) for seed in (0, 1)]


def export(api: httpx.Client, name: str, session_id: str) -> dict:
    response = api.post("/admin/session/export", json={"name": name, "session_id": session_id})
    assert response.status_code == 200, response.text
    return response.json()


def restore(client: httpx.Client, name: str, session_id: str, blob_b64: str, tokens: list[int]) -> httpx.Response:
    body = {"name": name, "session_id": session_id, "blob": blob_b64, "tokens": tokens}
    return client.post("/session/restore", json=body)


def held(api: httpx.Client, name: str) -> dict[str, tuple[int, int]]:
    """Each session's conversations and tokens."""
    return {sid: (row["conversations"], row["tokens"]) for sid, row in sessions_of(api, name).items()}


def next_turn(messages: list[dict], body: dict, text: str) -> list[dict]:
    return [*messages, assistant_message(body), {"role": "user", "content": text}]


def test_export_restart_restore_continue(start_server, operator_token, stories_hf_dir):
    first = start_server()
    # Not operator_client: it unloads on leaving, and an unloaded model is not brought back at start.
    with httpx.Client(base_url=first.url, timeout=60, headers=bearer(operator_token)) as api:
        load(api, stories_hf_dir, "s")
        turns = converse(api, "s", USER_TURNS[:2], session_id="travels")
        exported = export(api, "s", "travels")
        messages = next_turn(*turns[-1], USER_TURNS[2])
        uninterrupted = chat(api, "s", messages, session_id="travels")
    assert first.stop() == 0

    second = start_server()  # a new platform on the same database: the catalogue loads "s" again
    with operator_client(second, operator_token) as api:
        wait_for(lambda: [m["id"] for m in api.get("/v1/models").json()["data"]] == ["s"], timeout=60)
        assert sessions_of(api, "s") == {}
        restored = restore(api, "s", "travels", exported["blob_b64"], exported["tokens"])
        assert restored.status_code == 200, restored.text
        assert restored.json() == {"restored": True, "session_id": "travels", "n_tok": exported["n_tok"]}
        again = export(api, "s", "travels")
        assert (again["weights_version"], again["tokens"]) == (exported["weights_version"], exported["tokens"])

        continued = chat(api, "s", messages, session_id="travels")
        cached = continued["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached > 0 and cached == uninterrupted["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert answer(continued) == answer(uninterrupted)
        assert continued["usage"] == uninterrupted["usage"]


def test_blobs_that_do_not_belong_are_refused_and_change_nothing(api, demo_dirs, stories_hf_dir):
    ours, theirs = demo_dirs
    load(api, ours, "d")
    load(api, theirs, "other-weights")
    load(api, stories_hf_dir, "other-arch")
    [(messages, first)] = converse(api, "d", USER_TURNS[:1], session_id="keep")
    exported = export(api, "d", "keep")
    blob = base64.b64decode(exported["blob_b64"])
    tokens = exported["tokens"]
    middle = len(blob) // 2
    damaged = {
        "truncated": blob[:middle],
        "altered": blob[:middle] + bytes([blob[middle] ^ 0x01]) + blob[middle + 1 :],
        "extended": blob + b"\0",
    }
    held_before = held(api, "d")

    for how, bad in damaged.items():
        for session_id in ("keep", "new"):  # over a live session, and as a new one
            response = restore(api, "d", session_id, base64.b64encode(bad).decode(), tokens)
            assert error_of(response) == (400, "bad_session_blob"), (how, session_id)
    for other_tokens in ([*tokens, tokens[-1]], tokens[:-1], [tokens[0] + 1, *tokens[1:]]):
        response = restore(api, "d", "keep", exported["blob_b64"], other_tokens)
        assert error_of(response) == (400, "bad_session_blob")
    assert error_of(restore(api, "other-arch", "keep", exported["blob_b64"], tokens)) == (400, "bad_session_blob")
    response = restore(api, "other-weights", "keep", exported["blob_b64"], tokens)
    assert error_of(response) == (409, "weights_version_mismatch")

    assert held(api, "d") == held_before == {"keep": (1, len(tokens))}
    assert sessions_of(api, "other-weights") == {} and sessions_of(api, "other-arch") == {}
    # The live session is as it was: its next turn resumes all of it.
    body = chat(api, "d", next_turn(messages, first, USER_TURNS[1]), session_id="keep")
    usage = first["usage"]
    assert (
        body["usage"]["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )

    # The sound blob restores under a new id, and that turn is as warm.
    assert restore(api, "d", "copy", exported["blob_b64"], tokens).status_code == 200
    copy = chat(api, "d", next_turn(messages, first, USER_TURNS[1]), session_id="copy")
    assert (
        copy["usage"]["prompt_tokens_details"]["cached_tokens"]
        == body["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert answer(copy) == answer(body)


def test_a_restore_beyond_max_sessions_is_429(api, stories_hf_dir):
    load(api, stories_hf_dir, "cap", max_sessions=1)
    converse(api, "cap", USER_TURNS[:1], session_id="one")
    exported = export(api, "cap", "one")
    response = restore(api, "cap", "two", exported["blob_b64"], exported["tokens"])
    assert error_of(response) == (429, "model_at_session_capacity")
    assert response.headers["Retry-After"] == "30"
    assert set(sessions_of(api, "cap")) == {"one"}
    # Restoring over the id that holds the slot is no new session.
    assert restore(api, "cap", "one", exported["blob_b64"], exported["tokens"]).status_code == 200
