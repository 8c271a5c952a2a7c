"""A streaming chat completion writes the token events that are already waiting when it gets to them in one write
(a busy server that fell behind the steps catches up in fewer trips through Django, daphne and the socket), and the
client reads the same events as one write per token would give; events that arrived before a failure still come
first, ahead of the error event."""

import asyncio
import json

from inference.api.chat_requests import parse_chat_request
from inference.api.completion_bodies import CompletionContext, stream_chunks
from inference.engine.contract import messages as p
from inference.engine.contract.reasons import Reason
from inference.runtime.generation import EngineError, Generation

BODY = {"model": "m", "messages": [{"role": "user", "content": "Once upon a time"}], "stream": True}


def generation(*events) -> Generation:
    queue: asyncio.Queue = asyncio.Queue()
    for event in events:
        queue.put_nowait(event)
    started = p.Started(request_id="r", prompt_tokens=5, cached_tokens=0, kv_cap=256)
    return Generation("r", started, queue, lambda request_id: None)


def tokens(text: str) -> p.Tokens:
    return p.Tokens(request_id="r", token_ids=[1], text=text)


async def writes(*events) -> list[bytes]:
    context = CompletionContext(parse_chat_request(json.dumps(BODY).encode()), "m")
    return [chunk async for chunk in stream_chunks([generation(*events)], context)]


def events_of(written: list[bytes]) -> list[str]:
    """Each event's delta content, finish reason or error type, in order."""
    out = []
    for event in b"".join(written).decode().split("\n\n")[:-1]:
        data = event.removeprefix("data: ")
        if data == "[DONE]":
            out.append("[DONE]")
            continue
        body = json.loads(data)
        if "error" in body:
            out.append("error:" + body["error"]["type"])
            continue
        choice = body["choices"][0]
        out.append(choice["delta"].get("content", choice["finish_reason"] or "role"))
    return out


async def test_tokens_already_waiting_leave_in_one_write():
    finished = p.Finished(
        request_id="r",
        finish_reason="length",
        prompt_tokens=5,
        completion_tokens=3,
        cached_tokens=0,
        kv_used=8,
        kv_cap=256,
    )
    written = await writes(tokens("Once"), tokens(" upon"), tokens(" a"), finished)
    assert events_of(written) == ["role", "Once", " upon", " a", "length", "[DONE]"]
    assert len(written) == 4  # the role; the three tokens together; the closing chunk; [DONE]
    assert written[1].count(b"data: ") == 3


async def test_tokens_that_arrived_before_a_failure_come_ahead_of_the_error():
    failure = EngineError("the worker died", Reason.WORKER_DIED)
    written = await writes(tokens("Once"), tokens(" upon"), failure)
    assert events_of(written)[:3] == ["role", "Once", " upon"]
    assert events_of(written)[3].startswith("error:")
