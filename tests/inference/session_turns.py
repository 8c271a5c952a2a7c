"""Conversations over HTTP for the session tests: a chat turn, the assistant message a client sends back (exactly
as the server returned it), loads, and what GET /admin/sessions and /admin/models show."""

from __future__ import annotations

from typing import Any

import httpx

SYSTEM = {"role": "system", "content": "You tell short stories to children."}
USER_TURNS = ["Tell me about a cat named Tom.", "What did Tom eat?", "Where did he sleep?", "How did it end?"]
MAX_TOKENS = 12


def load(api: httpx.Client, path, name: str, **options: Any) -> dict:
    response = api.post("/admin/models/load", json={"path": str(path), "name": name, **options})
    assert response.status_code == 200, response.text
    return response.json()


def unload(api: httpx.Client, name: str) -> None:
    response = api.post("/admin/models/unload", json={"name": name})
    assert response.status_code == 200, response.text


def chat(
    client: httpx.Client,
    model: str,
    messages: list[dict],
    *,
    session_id: str | None = None,
    headers: dict | None = None,
    max_tokens: int = MAX_TOKENS,
    expect: int = 200,
    **fields: Any,
) -> dict:
    """One greedy chat turn; asserts its status and returns the body."""
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens, **fields}
    if session_id is not None:
        body["session_id"] = session_id
    response = client.post("/v1/chat/completions", json=body, headers=headers or {})
    assert response.status_code == expect, response.text
    return response.json()


def assistant_message(body: dict) -> dict:
    """The turn's answer as the next request replays it: content, and reasoning_content when there was some."""
    message = body["choices"][0]["message"]
    replay = {"role": "assistant", "content": message["content"]}
    if message.get("reasoning_content"):
        replay["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        replay["tool_calls"] = message["tool_calls"]
    return replay


def answer(body: dict) -> tuple[str | None, str | None]:
    message = body["choices"][0]["message"]
    return message["content"], message.get("reasoning_content")


def converse(
    client: httpx.Client, model: str, user_turns: list[str], *, session_id: str | None, history: list | None = None
) -> list[tuple[list[dict], dict]]:
    """Runs the turns in order, each replaying the previous answers; returns (messages sent, body) per turn."""
    messages = list(history if history is not None else [SYSTEM])
    turns = []
    for text in user_turns:
        messages.append({"role": "user", "content": text})
        body = chat(client, model, messages, session_id=session_id)
        turns.append((list(messages), body))
        messages.append(assistant_message(body))
    return turns


def sessions_of(api: httpx.Client, model: str) -> dict[str, dict]:
    """GET /admin/sessions?name=model, by session id."""
    response = api.get("/admin/sessions", params={"name": model})
    assert response.status_code == 200, response.text
    return {row["session_id"]: row for row in response.json()["data"]}


def live_row(api: httpx.Client, model: str) -> dict:
    rows = api.get("/admin/models").json()["data"]
    return next(row for row in rows if row["id"] == model)["live"]


def error_of(response: httpx.Response) -> tuple[int, str]:
    """(status, error type) of an error response in the OpenAI envelope."""
    return response.status_code, response.json()["error"]["type"]
