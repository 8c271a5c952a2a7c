"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A request is turned into the chat request it means (instructions as the system turn, a stored response's conversation
for `previous_response_id`, the input items as turns, function tools and `text.format` as chat's tools and
response_format) and runs through the chat route's validation and answer parsing, on the generation routes' skeleton
(generation_route.py); only the bodies differ. Output items: a `message` with one `output_text` part, and a
`function_call` per tool call. Streaming sends OpenAI's event sequence (response.created, response.in_progress,
output_item.added, content_part.added, output_text.delta..., output_text.done, content_part.done, output_item.done,
response.completed).

A stored response (`store`, the default) keeps its conversation in the control plane's memory
(runtime/response_store.py); continuing it sends the whole conversation again, whose beginning the worker finds in its
prefix cache, so only the new input is prefilled (`usage.input_tokens_details.cached_tokens`).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from django.http import JsonResponse

from inference.api.answer_parts import AnswerParts
from inference.api.chat_requests import ChatCompletionSerializer, chat_request_from
from inference.api.completion_bodies import millm_model, sse
from inference.api.generation_route import GenerationRun, run_generation
from inference.api.serializers import parse_json_object, validated
from inference.engine.contract import messages as p
from inference.engine.contract.dialects.base import DEFAULT_DIALECT
from inference.runtime.client_protocol import ModelPlacement
from inference.runtime.generation import EngineError, Generation
from inference.runtime.response_store import StoredResponse, response_store
from inference.services.refusals import as_api_error
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import InvalidRequest, NotFound
from pantheon_site.methods import only

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _turns(items: Any) -> list[dict[str, Any]]:
    """The input as chat turns: a string is one user turn; items are messages, function calls and their outputs."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise InvalidRequest("input must be a string or a non-empty list of input items", reason="input")
    turns = []
    for item in items:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role", "user") in ROLES:
            turns.append({"role": ROLES[item.get("role", "user")], "content": item.get("content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            turns.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output", "")})
        else:
            raise InvalidRequest(
                f"input item {item!r:.80} is not a message, function_call or function_call_output", reason="input"
            )
    return turns


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as chat's nested ones; any other kind of tool is refused."""
    if not tools:
        return None
    if not isinstance(tools, list) or any(not isinstance(t, dict) or t.get("type") != "function" for t in tools):
        raise InvalidRequest("only function tools are supported", reason="tools")
    keys = ("name", "description", "parameters")
    return [{"type": "function", "function": {k: t[k] for k in keys if k in t}} for t in tools]


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's response_format."""
    fmt = (text or {}).get("format") if isinstance(text, dict) else None
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": fmt.get("type")}


class ResponseRun(GenerationRun):
    """One POST /v1/responses on the generation skeleton (generation_route.py): the request as given, the chat request
    it means, and its ids. A refusal is never sent as a stream: a Responses stream has its own events."""

    stream_refusals = False

    def __init__(self, body: dict[str, Any], previous: StoredResponse | None):
        self.body = body
        self.previous = previous
        self.id = new_id("resp")
        self.message_id = new_id("msg")
        self.created_at = int(time.time())
        self.store = body.get("store", True) is not False
        self.history = (previous.messages if previous else []) + _turns(body.get("input"))
        instructions = body.get("instructions")
        system = [{"role": "system", "content": instructions}] if instructions else []
        chat = {
            "model": body.get("model") or (previous.model if previous else ""),
            "messages": system + self.history,
            "stream": bool(body.get("stream")),
            "tools": _tools(body.get("tools")),
            "tool_choice": _tool_choice(body.get("tool_choice")),
            "response_format": _response_format(body.get("text")),
        }
        for source, target in (
            ("max_output_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("seed", "seed"),
        ):
            if body.get(source) is not None:
                chat[target] = body[source]
        self.chat = chat_request_from(
            validated(ChatCompletionSerializer, {k: v for k, v in chat.items() if v is not None})
        )
        self.requested_model = self.chat.model
        self.stream = self.chat.delivery.stream

    def session_key(self) -> str | None:
        return self.chat.session_id

    def place(self, model: str, placement: ModelPlacement) -> None:
        self.model = model
        self.placement = placement
        self.dialect = placement.info.tool_dialect if placement.info else DEFAULT_DIALECT

    def submits(self) -> list[p.Submit]:
        return self.chat.submits(self.model, self.id)

    def parts(self, generation: Generation) -> AnswerParts:
        return AnswerParts(thinking=generation.started.thinking, dialect=self.dialect, tools=self.chat.tool_plan.tools)

    async def complete(self, generations: list[Generation]) -> dict[str, Any]:
        (generation,) = generations
        return await complete(self, self.model, generation, self.parts(generation))

    def events(self, generations: list[Generation]) -> AsyncIterator[bytes]:
        (generation,) = generations
        return stream(self, self.model, generation, self.parts(generation))

    def response(self, model: str, status: str, output: list[dict], usage: dict | None, reason: str | None = None):
        body = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": self.previous.id if self.previous else None,
            "temperature": self.chat.sampling.temperature,
            "top_p": self.chat.sampling.top_p,
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "text": body.get("text") or {"format": {"type": "text"}},
            "store": self.store,
            "metadata": body.get("metadata") or {},
            "usage": usage,
        }

    def message_item(self, text: str, status: str = "completed") -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": []}
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": [part]}

    def keep(self, model: str, response: dict[str, Any], text: str, calls: list) -> None:
        """Stores the response with its conversation (its output as the assistant turn), unless `store` is false."""
        if not self.store:
            return
        turn: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            turn["tool_calls"] = [call.body() for call in calls]
        response_store().put(StoredResponse(self.id, model, [*self.history, turn], response))


def _usage(finished: p.Finished) -> dict[str, Any]:
    return {
        "input_tokens": finished.prompt_tokens,
        "input_tokens_details": {"cached_tokens": finished.cached_tokens},
        "output_tokens": finished.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }


def _call_item(call) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def _previous(body: dict[str, Any]) -> StoredResponse | None:
    wanted = body.get("previous_response_id")
    if wanted is None:
        return None
    found = response_store().get(wanted) if isinstance(wanted, str) else None
    if found is None:
        raise InvalidRequest(f"previous_response_id: no stored response has id {wanted!r}", reason="unknown_response")
    return found


@only("POST")
async def create(request):
    await arequire_client_token(request, operation="response")
    body = parse_json_object(request.body)
    return await run_generation(request, ResponseRun(body, _previous(body)))


async def complete(run: ResponseRun, model: str, generation: Generation, parts: AnswerParts) -> dict[str, Any]:
    texts: list[str] = []
    try:
        async with generation:
            async for event in generation:
                if isinstance(event, p.Tokens):
                    texts += [value for kind, value in parts.push(event.text) if kind == "content"]
    except EngineError as exc:
        raise as_api_error(exc) from exc
    texts += [value for kind, value in parts.flush() if kind == "content"]
    text = "".join(texts)
    output = ([run.message_item(text)] if text or not parts.calls else []) + [_call_item(c) for c in parts.calls]
    reason = generation.finished.finish_reason
    status = "incomplete" if reason == "length" else "completed"
    response = run.response(model, status, output, _usage(generation.finished), reason)
    run.keep(model, response, text, parts.calls)
    return response


async def stream(run: ResponseRun, model: str, generation: Generation, parts: AnswerParts) -> AsyncIterator[bytes]:
    sequence = iter(range(1 << 62))

    def event(kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        return sse(data, event=kind)

    where = {"item_id": run.message_id, "output_index": 0, "content_index": 0}
    in_progress = run.response(model, "in_progress", [], None)
    yield event("response.created", response=in_progress)
    yield event("response.in_progress", response=in_progress)
    yield event("response.output_item.added", output_index=0, item=run.message_item("", "in_progress"))
    yield event(
        "response.content_part.added",
        part={"type": "output_text", "text": "", "annotations": []},
        **{k: v for k, v in where.items()},
    )
    texts: list[str] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(generation)
            async for token_event in generation:
                if isinstance(token_event, p.Tokens):
                    for kind, value in parts.push(token_event.text):
                        if kind == "content":
                            texts.append(value)
                            yield event("response.output_text.delta", delta=value, logprobs=[], **where)
            for kind, value in parts.flush():
                if kind == "content":
                    texts.append(value)
                    yield event("response.output_text.delta", delta=value, logprobs=[], **where)
    except EngineError as exc:
        error = as_api_error(exc)
        yield event("error", code=error.type, message=error.message, param=None)
        return
    text = "".join(texts)
    part = {"type": "output_text", "text": text, "annotations": []}
    yield event("response.output_text.done", text=text, logprobs=[], **where)
    yield event("response.content_part.done", part=part, **where)
    yield event("response.output_item.done", output_index=0, item=run.message_item(text))
    output = [run.message_item(text)]
    for index, call in enumerate(parts.calls, start=1):
        item = _call_item(call)
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress"})
        yield event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=index,
            arguments=call.arguments,
            name=call.name,
        )
        yield event("response.output_item.done", output_index=index, item=item)
        output.append(item)
    reason = generation.finished.finish_reason
    status = "incomplete" if reason == "length" else "completed"
    response = run.response(model, status, output, _usage(generation.finished), reason)
    run.keep(model, response, text, parts.calls)
    which = millm_model(run.placement)
    yield event(f"response.{status}", response=response, **({"millm_model": which} if which else {}))


async def stored(request, response_id: str):
    """GET (the stored response) or DELETE (forget it) /v1/responses/{id}; 404 for an id not stored."""
    await arequire_client_token(request, operation="response_read")
    store = response_store()
    if request.method == "GET":
        found = store.get(response_id)
        if found is None:
            raise NotFound(f"no stored response has id {response_id!r}", reason="unknown_response")
        return JsonResponse(found.body)
    if request.method == "DELETE":
        if not store.delete(response_id):
            raise NotFound(f"no stored response has id {response_id!r}", reason="unknown_response")
        return JsonResponse({"id": response_id, "object": "response.deleted", "deleted": True})
    raise NotFound()
