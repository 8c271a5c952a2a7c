"""The prefix cache as a client and an operator see it, against a running server (stories260K on the CPU worker):
requests that share a long system prompt reuse its KV (`cached_tokens`) and hold its blocks once (/admin/models)."""

import httpx
import pytest

from pantheon_site.tokens import do_create_token
from tests.inference.serving import bearer

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = " ".join(f"Rule {i}: the cat sat on the mat and the dog ran to the park." for i in range(10))


@pytest.fixture(scope="module")
def server(start_server, stories_hf_dir):
    server = start_server()
    token = do_create_token("operator", "prefix-loader")[1]
    with httpx.Client(base_url=server.url, timeout=120, headers=bearer(token)) as api:
        response = api.post("/admin/models/load", json={"path": str(stories_hf_dir), "name": "stories"})
        assert response.status_code == 200, response.text
    return server


def live_blocks(api) -> dict:
    rows = api.get("/admin/models").json()["data"]
    return next(row for row in rows if row["id"] == "stories")["live"]


def ask(api, session_id: str, question: str) -> dict:
    body = {
        "model": "stories",
        "session_id": session_id,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_two_sessions_sharing_a_system_prompt_reuse_and_share_its_blocks(api):
    before = live_blocks(api)
    first = ask(api, "alice", "Who sat on the mat?")
    assert first["prompt_tokens"] > 300 and first["prompt_tokens_details"]["cached_tokens"] == 0
    after_first = live_blocks(api)
    held_by_first = before["blocks_free"] - after_first["blocks_free"]
    assert after_first["sessions"] == before["sessions"] + 1
    assert after_first["blocks_pinned"] == held_by_first == -(-(first["prompt_tokens"] + 4) // 16)

    second = ask(api, "bob", "Where did the dog run?")
    shared = second["prompt_tokens_details"]["cached_tokens"]
    assert shared >= 288  # the system prompt's full blocks, and what the block after them shares (copied)
    after_second = live_blocks(api)
    held_by_second = -(-(second["prompt_tokens"] + 4) // 16)
    # the system prompt's full blocks are held once: the second session added only the blocks past them
    assert after_first["blocks_free"] - after_second["blocks_free"] == held_by_second - shared // 16
    assert after_second["blocks_pinned"] == held_by_first + held_by_second - shared // 16
    for session_id in ("alice", "bob"):
        assert api.post("/session/release", json={"session_id": session_id}).status_code == 200
    released = live_blocks(api)
    assert released["blocks_pinned"] == 0 and released["sessions"] == before["sessions"]
    assert released["blocks_cached"] >= shared // 16  # the shared prefix stays cached for the next request
