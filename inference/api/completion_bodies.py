"""Chat completion bodies: the non-streaming response, and the SSE chunks of a streaming one, from a `Generation`.

Streaming chunks follow the spec's order: a `{"role": "assistant"}` delta, then reasoning and content deltas as the
worker produces text, a closing chunk with the finish reason, the usage chunk when `stream_options.include_usage`
asks for it, and `data: [DONE]`. An error after the stream opened cannot change the status any more: it is sent as
one terminal `data: {"error": {...}}` event (with kv_used/kv_cap for context_over_budget) and the stream ends.
Leaving a generation early (the client disconnected, so the ASGI handler cancelled the response) aborts it in the
worker at once: every path out of these functions goes through `Generation.__aexit__`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from inference.api.answer_parts import AnswerParts, finish_reason
from inference.api.chat_requests import ChatRequest
from inference.engine.contract import messages as p
from inference.engine.contract.dialects.base import DEFAULT_DIALECT
from inference.runtime.client_protocol import ModelPlacement
from inference.runtime.generation import EngineError, Generation
from inference.services.refusals import as_api_error
from pantheon_site.errors import PantheonError, openai_error_body


def new_completion_id() -> str:
    """A unique, unguessable completion id (96 random bits)."""
    return "chatcmpl-" + secrets.token_hex(12)


def usage_body(generations: list[Generation]) -> dict[str, Any]:
    """The request's usage: the prompt counted once, completion tokens summed across choices, the KV numbers of the
    fullest choice (cached_tokens of the first, the one that uses the session), and `session_conflict: true` when
    the worker said conversations of the session competed (left out otherwise)."""
    finished = [g.finished for g in generations]
    prompt = finished[0].prompt_tokens
    completion = sum(f.completion_tokens for f in finished)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": finished[0].cached_tokens},
        "kv_used": max(f.kv_used for f in finished),
        "kv_cap": finished[0].kv_cap,
    }
    if any(f.session_conflict for f in finished):
        usage["session_conflict"] = True
    return usage


def logprobs_content(tokens: p.Tokens) -> list[dict[str, Any]]:
    """OpenAI's `logprobs.content` entries for the tokens of one TOKENS message: `token` is what the token added to
    the text and `bytes` its UTF-8, so the entries' tokens, and their bytes, spell the text exactly (a token that
    ends in half a character adds nothing until the token that completes it; a character that never completes is
    U+FFFD, as in the text). The alternatives are tokens as they are."""

    def entry(token: bytes, logprob: float) -> dict[str, Any]:
        return {"token": token.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(token)}

    return [
        {
            "token": lp.text,
            "logprob": lp.logprob,
            "bytes": list(lp.text.encode()),
            "top_logprobs": [entry(t.token, t.logprob) for t in lp.top],
        }
        for lp in tokens.logprobs or []
    ]


def millm_model(placement: ModelPlacement | None) -> str | None:
    """Which parameter set answered (X-miLLM-Model): `"<served name>";origin=<origin>;commits=<n>` (commits left out
    when unknown), read when the answer is complete. The weights cannot change under a running generation (a
    quiesce waits for it to finish), so what the served model carries then is what produced it, also for a request
    that waited through a commit."""
    weights = placement.weights if placement is not None else None
    if weights is None:
        return None
    value = f"{json.dumps(weights.served_name)};origin={weights.origin}"
    return value if weights.commits is None else f"{value};commits={weights.commits}"


class CompletionContext:
    """What every body of one completion shares: id, creation time, the served name, the request, and the tool
    dialect the served model writes (from its LOADED)."""

    def __init__(
        self, chat: ChatRequest, model: str, loaded: p.Loaded | None = None, placement: ModelPlacement | None = None
    ):
        self.chat = chat
        self.model = model
        self.placement = placement
        self.dialect = loaded.tool_dialect if loaded is not None else DEFAULT_DIALECT
        self.id = new_completion_id()
        self.created = int(time.time())

    def answer_parts(self, generation: Generation) -> AnswerParts:
        return AnswerParts(thinking=generation.started.thinking, dialect=self.dialect, tools=self.chat.tool_plan.tools)

    def format_status(self, *finished: p.Finished) -> dict[str, Any]:
        """`response_format_status` for choices that ended with `finished` (empty when no response_format was sent):
        `not_enforced` if any of them did not complete the grammar."""
        plan = self.chat.response_format
        if plan.status is None:
            return {}
        complete = None if plan.grammar is None else all(f.grammar_complete for f in finished)
        return {"response_format_status": plan.final_status(complete)}

    def millm_model(self) -> str | None:
        return millm_model(self.placement)

    def terminal_fields(self, terminal: bool) -> dict[str, Any]:
        """`millm_model` on a stream's terminal chunk (the last before [DONE])."""
        return {"millm_model": value} if terminal and (value := self.millm_model()) else {}

    def envelope(self, obj: str) -> dict[str, Any]:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.chat.delivery.n_status:
            body["n_status"] = self.chat.delivery.n_status
        return body


async def complete(generations: list[Generation], ctx: CompletionContext) -> dict[str, Any]:
    """Runs the generations (one per choice) to their end and returns the `chat.completion` body. Raises the API
    error of a failure (the other choices are aborted then)."""
    choices = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for generation in generations:
                await stack.enter_async_context(generation)
            for index, generation in enumerate(generations):
                choices.append(await _choice(generation, index, ctx))
    except EngineError as exc:
        raise as_api_error(exc) from exc
    body = {**ctx.envelope("chat.completion"), "choices": choices, "usage": usage_body(generations)}
    return body | ctx.format_status(*(g.finished for g in generations))


async def _choice(generation: Generation, index: int, ctx: CompletionContext) -> dict[str, Any]:
    answer = ctx.answer_parts(generation)
    texts: dict[str, list[str]] = {"reasoning": [], "content": []}
    logprobs = []
    async for event in generation:
        if isinstance(event, p.Tokens):
            for kind, value in answer.push(event.text):
                if kind != "tool_call":
                    texts[kind].append(value)
            logprobs += logprobs_content(event)
    for kind, value in answer.flush():
        if kind != "tool_call":
            texts[kind].append(value)
    content = "".join(texts["content"])
    message: dict[str, Any] = {"role": "assistant", "content": None if answer.calls and not content else content}
    if reasoning_text := "".join(texts["reasoning"]):
        message["reasoning_content"] = reasoning_text
    if answer.calls:
        message["tool_calls"] = [call.body() for call in answer.calls]
    reason = finish_reason(generation.finished.finish_reason, answer.calls)
    choice: dict[str, Any] = {"index": index, "message": message, "finish_reason": reason}
    if answer.error is not None:
        choice["tool_call_error"] = answer.error.body()
    if ctx.chat.wants_logprobs:
        choice["logprobs"] = {"content": logprobs}
    return choice


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event (named `event`, where the stream names its events). msgspec encodes a chunk in a tenth
    of json.dumps's time, the same bytes but for a float's exponent (1e-7, not 1e-07) and a non-finite float (null,
    where json.dumps writes NaN, which is not JSON): a stream is an event per token, so this is most of what the
    server spends per token."""
    payload = data.encode() if isinstance(data, str) else msgspec.json.encode(data)
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + payload + b"\n\n"


def error_event(error: PantheonError) -> bytes:
    """The terminal event of a stream that failed after it opened."""
    return sse(openai_error_body(error, streaming=True))


async def stream_chunks(generations: list[Generation], ctx: CompletionContext) -> AsyncIterator[bytes]:
    """The SSE events of a streaming completion (see the module docstring); with n > 1 the choices stream one after
    another, each from its role delta to its closing chunk, told apart by `index`."""
    async with contextlib.AsyncExitStack() as stack:
        for generation in generations:
            await stack.enter_async_context(generation)
        for index, generation in enumerate(generations):
            try:
                async for event in _choice_chunks(generation, index, ctx):
                    yield event
            except EngineError as exc:
                yield error_event(as_api_error(exc))
                return
    if ctx.chat.delivery.include_usage:
        usage = {**ctx.envelope("chat.completion.chunk"), "choices": [], "usage": usage_body(generations)}
        yield sse(usage | ctx.terminal_fields(True))
    yield sse("[DONE]")


async def _choice_chunks(generation: Generation, index: int, ctx: CompletionContext) -> AsyncIterator[bytes]:
    def chunk(delta: dict[str, Any], finish_reason: str | None = None, top: dict | None = None, **extra: Any) -> bytes:
        choice = {"index": index, "delta": delta, **extra, "finish_reason": finish_reason}
        return sse({**ctx.envelope("chat.completion.chunk"), "choices": [choice], **(top or {})})

    def part_chunks(parts: list, logprobs: list | None = None) -> list[bytes]:
        """The chunks of `parts`; `logprobs` (the TOKENS' entries) ride the content chunk, or one of their own."""
        chunks = []
        for kind, value in parts:
            if kind == "reasoning":
                chunks.append(chunk({"reasoning_content": value}))
            elif kind == "content":
                extra = {"logprobs": {"content": logprobs}} if logprobs is not None else {}
                chunks.append(chunk({"content": value}, **extra))
                logprobs = None
            else:
                calls.append(value)
                opening = {"index": len(calls) - 1, "id": value.id, "type": "function"}
                chunks.append(chunk({"tool_calls": [{**opening, "function": {"name": value.name, "arguments": ""}}]}))
                arguments = {"index": len(calls) - 1, "function": {"arguments": value.arguments}}
                chunks.append(chunk({"tool_calls": [arguments]}))
        if logprobs:
            chunks.append(chunk({"content": ""}, logprobs={"content": logprobs}))
        return chunks

    answer = ctx.answer_parts(generation)
    calls: list = []
    yield chunk({"role": "assistant"})
    pending: list[bytes] = []  # chunks not written yet
    try:
        async for event in generation:
            if isinstance(event, p.Tokens):
                logprobs = logprobs_content(event) if ctx.chat.wants_logprobs else None
                pending += part_chunks(answer.push(event.text), logprobs)
            if pending and not generation.ready():
                # Events that arrived together (the server fell behind the steps) leave in one write: each write
                # is a trip through Django, daphne and a socket send, which is what a busy server can least afford.
                yield b"".join(pending)
                pending = []
    except EngineError:
        if pending:  # what arrived before the failure still reaches the client, ahead of the error event
            yield b"".join(pending)
        raise
    pending += part_chunks(answer.flush())
    extra = {"tool_call_error": answer.error.body()} if answer.error is not None else {}
    reason = finish_reason(generation.finished.finish_reason, answer.calls)
    terminal = index == ctx.chat.delivery.n - 1 and not ctx.chat.delivery.include_usage
    pending.append(
        chunk({}, reason, top=ctx.format_status(generation.finished) | ctx.terminal_fields(terminal), **extra)
    )
    yield b"".join(pending)


async def refused_stream(error: PantheonError) -> AsyncIterator[bytes]:
    """A stream whose request was refused with a stream-form error (context_over_budget): just the error event."""
    yield error_event(error)
