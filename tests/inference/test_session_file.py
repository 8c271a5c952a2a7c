"""A session larger than the body limit: exported as a session file (`Accept: application/octet-stream`) and restored
from it as a raw body, which PANTHEON_SESSION_RESTORE_MAX_BYTES limits instead of PANTHEON_MAX_BODY_BYTES. The
server's body limit is set small, so that stories260K's blob of a two-turn conversation is over it: its JSON form
is refused 413, its session file is restored and continues warm."""

import httpx
import pytest

from inference.services.session_file import session_file
from tests.inference.serving import operator_client
from tests.inference.session_turns import USER_TURNS, assistant_message, chat, converse, error_of, load

pytestmark = pytest.mark.django_db(transaction=True)

BODY_LIMIT = 32 * 1024
RESTORE_LIMIT = 1024 * 1024
RAW = {"Content-Type": "application/octet-stream"}


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(PANTHEON_MAX_BODY_BYTES=str(BODY_LIMIT), PANTHEON_SESSION_RESTORE_MAX_BYTES=str(RESTORE_LIMIT))


@pytest.fixture
def api(server, operator_token, stories_hf_dir):
    with operator_client(server, operator_token) as client:
        load(client, stories_hf_dir, "s")
        yield client


def export(api: httpx.Client, session_id: str, **headers: str) -> httpx.Response:
    response = api.post("/admin/session/export", json={"name": "s", "session_id": session_id}, headers=headers)
    assert response.status_code == 200, response.text
    return response


def restore_raw(api: httpx.Client, session_id: str, body: bytes) -> httpx.Response:
    return api.post("/session/restore", params={"name": "s", "session_id": session_id}, content=body, headers=RAW)


def test_a_session_over_the_body_limit_is_restored_from_its_session_file_and_continues_warm(api):
    turns = converse(api, "s", USER_TURNS[:2], session_id="original")
    exported = export(api, "original").json()
    assert exported["blob_bytes"] > BODY_LIMIT
    body = {"name": "s", "session_id": "copy", "blob": exported["blob_b64"], "tokens": exported["tokens"]}
    assert error_of(api.post("/session/restore", json=body)) == (413, "invalid_request_error")  # the JSON form

    file = export(api, "original", Accept="application/octet-stream")
    assert file.headers["content-type"] == "application/octet-stream"
    assert len(file.content) > BODY_LIMIT
    restored = restore_raw(api, "copy", file.content)  # export's answer as it is
    assert restored.status_code == 200, restored.text
    assert restored.json() == {"restored": True, "session_id": "copy", "n_tok": exported["n_tok"]}
    assert export(api, "copy").json()["blob_b64"] == exported["blob_b64"]

    messages = [*turns[-1][0], assistant_message(turns[-1][1]), {"role": "user", "content": USER_TURNS[2]}]
    original = chat(api, "s", messages, session_id="original")
    copy = chat(api, "s", messages, session_id="copy")
    assert copy["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert copy["choices"][0]["message"] == original["choices"][0]["message"]
    assert copy["usage"] == original["usage"]


def test_session_files_that_cannot_be_restored_are_refused(api):
    converse(api, "s", USER_TURNS[:1], session_id="kept")
    file = export(api, "kept", Accept="application/octet-stream").content
    window = api.get("/admin/models").json()["data"][0]["context_window"]
    too_long = session_file(list(range(window + 1)), b"never read")
    for broken in (b"", file[:3], file[:12], too_long):
        assert error_of(restore_raw(api, "other", broken)) == (400, "bad_session_blob")
    over = api.post(
        "/session/restore", params={"session_id": "other"}, content=b"\0" * (RESTORE_LIMIT + 1), headers=RAW
    )
    assert error_of(over) == (413, "invalid_request_error")
    assert "PANTHEON_SESSION_RESTORE_MAX_BYTES" in over.json()["error"]["message"]
    missing_id = api.post("/session/restore", params={"name": "s"}, content=file, headers=RAW)
    assert error_of(missing_id) == (400, "invalid_request_error")
