"""Chat completion bodies: the non-streaming response, and the SSE chunks of a streaming one, from a `Generation`.

Streaming chunks follow the spec's order: a `{"role": "assistant"}` delta, then reasoning and content deltas as the
worker produces text, a closing chunk with the finish reason, the usage chunk when `stream_options.include_usage`
asks for it, and `data: [DONE]`. An error after the stream opened cannot change the status any more: it is sent as
one terminal `data: {"error": {...}}` event (with kv_used/kv_cap for context_over_budget) and the stream ends.
Leaving a generation early (the client disconnected, so the ASGI handler cancelled the response) aborts it in the
worker at once: every path out of these functions goes through `Generation.__aexit__`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from inference.engine import protocol as p
from inference.engine_client import EngineError, Generation
from inference.engine_errors import as_api_error
from inference.reasoning import ReasoningSplitter
from inference.serializers import ChatRequest
from pantheon_site.errors import PantheonError, openai_error_body


def new_completion_id() -> str:
    """A unique, unguessable completion id (96 random bits)."""
    return "chatcmpl-" + secrets.token_hex(12)


def usage_body(finished: p.Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
        "kv_used": finished.kv_used,
        "kv_cap": finished.kv_cap,
    }


def logprobs_content(tokens: p.Tokens) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` entries for the tokens of one TOKENS message."""

    def entry(token: bytes, logprob: float) -> dict[str, Any]:
        return {"token": token.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(token)}

    return [
        {**entry(lp.token, lp.logprob), "top_logprobs": [entry(t.token, t.logprob) for t in lp.top]}
        for lp in tokens.logprobs or []
    ]


class CompletionContext:
    """What every body of one completion shares: id, creation time, the served name, the request."""

    def __init__(self, chat: ChatRequest, model: str):
        self.chat = chat
        self.model = model
        self.id = new_completion_id()
        self.created = int(time.time())

    def envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


async def complete(generation: Generation, ctx: CompletionContext) -> dict[str, Any]:
    """Runs the generation to its end and returns the `chat.completion` body. Raises the API error of a failure."""
    splitter = ReasoningSplitter()
    reasoning, content, logprobs = [], [], []
    try:
        async with generation:
            async for event in generation:
                if isinstance(event, p.Tokens):
                    r, c = splitter.push(event.text)
                    reasoning.append(r)
                    content.append(c)
                    logprobs += logprobs_content(event)
    except EngineError as exc:
        raise as_api_error(exc) from exc
    r, c = splitter.flush()
    finished = generation.finished
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) + c}
    if reasoning_text := "".join(reasoning) + r:
        message["reasoning_content"] = reasoning_text
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finished.finish_reason}
    if ctx.chat.wants_logprobs:
        choice["logprobs"] = {"content": logprobs}
    return {**ctx.envelope("chat.completion"), "choices": [choice], "usage": usage_body(finished)}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def error_event(error: PantheonError) -> bytes:
    """The terminal event of a stream that failed after it opened."""
    return sse(openai_error_body(error, streaming=True))


async def stream_chunks(generation: Generation, ctx: CompletionContext) -> AsyncIterator[bytes]:
    """The SSE events of a streaming completion (see the module docstring)."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, **extra, "finish_reason": finish_reason}
        return sse({**ctx.envelope("chat.completion.chunk"), "choices": [choice]})

    splitter = ReasoningSplitter()
    async with generation:
        yield chunk({"role": "assistant"})
        try:
            async for event in generation:
                if not isinstance(event, p.Tokens):
                    continue
                reasoning, content = splitter.push(event.text)
                if reasoning:
                    yield chunk({"reasoning_content": reasoning})
                if content or (event.logprobs and ctx.chat.wants_logprobs):
                    extra = {"logprobs": {"content": logprobs_content(event)}} if ctx.chat.wants_logprobs else {}
                    yield chunk({"content": content}, **extra)
        except EngineError as exc:
            yield error_event(as_api_error(exc))
            return
    reasoning, content = splitter.flush()
    if reasoning:
        yield chunk({"reasoning_content": reasoning})
    if content:
        yield chunk({"content": content})
    finished = generation.finished
    yield chunk({}, finished.finish_reason)
    if ctx.chat.include_usage:
        yield sse({**ctx.envelope("chat.completion.chunk"), "choices": [], "usage": usage_body(finished)})
    yield sse("[DONE]")


async def refused_stream(error: PantheonError) -> AsyncIterator[bytes]:
    """A stream whose request was refused with a stream-form error (context_over_budget): just the error event."""
    yield error_event(error)
