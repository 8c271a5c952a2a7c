"""POST /v1/completions: OpenAI's legacy text completion, as evaluation harnesses and benchmarks use it.

The prompt is tokenized as it is (no chat template). Each prompt of the request is its own group of `n` choices
(choice `index` = prompt * n + choice), all submitted together so they decode in one batch. `echo` puts the prompt
in front of each choice's text; with `logprobs` the prompt's tokens are scored too (teacher-forced in the worker,
the first token's logprob null), which with `max_tokens: 0` is how a harness scores a continuation. `logprobs` is
OpenAI's legacy object: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`, whose tokens spell the text.
Admission, errors, audit and the in-flight count are the chat route's.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from django.http import JsonResponse, StreamingHttpResponse

from inference.api.completion_bodies import error_event, millm_model, refused_stream, sse
from inference.api.openai import MILLM_MODEL_HEADER, SSE_HEADERS, admit_all, counted
from inference.api.refusals import as_api_error
from inference.api.serializers import CompletionRequest, parse_completion_request, sampling_for_choice
from inference.engine.contract import messages as p
from inference.runtime.engine_client import ModelPlacement
from inference.runtime.generation import EngineError, Generation
from inference.runtime.router import get_router, load_allowed
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import ContextOverBudget
from pantheon_site.methods import only


class Choice:
    """One choice's prompt and what its generation produced so far, as the legacy body reports it."""

    def __init__(self, request: CompletionRequest, prompt: str | list[int]):
        self.request = request
        self.prompt = prompt
        self.offset = 0  # characters of this choice's text already reported (text_offset of the next token)

    def echo(self, scored: list[p.TokenLogprob] | None) -> tuple[str, list[p.TokenLogprob]]:
        """The prompt's text and the entries to report for it (none unless logprobs were asked for)."""
        if scored is not None:
            text = "".join(entry.text for entry in scored)
        else:
            text = self.prompt if isinstance(self.prompt, str) else ""
        return text, (scored or []) if self.request.logprobs is not None else []

    def logprobs(self, entries: list[p.TokenLogprob]) -> dict[str, list] | None:
        """The legacy logprobs object for `entries`, continuing this choice's text offsets."""
        if self.request.logprobs is None:
            return None
        body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in entries:
            body["tokens"].append(entry.text)
            body["token_logprobs"].append(entry.logprob)
            top = {t.token.decode("utf-8", errors="replace"): t.logprob for t in entry.top}
            body["top_logprobs"].append(None if entry.logprob is None else top)
            body["text_offset"].append(self.offset)
            self.offset += len(entry.text)
        return body


class TextCompletion:
    """What every body of one request shares."""

    def __init__(self, request: CompletionRequest, model: str, placement: ModelPlacement):
        self.request = request
        self.model = model
        self.placement = placement
        self.id = "cmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        n = request.generation.n
        self.choices = [Choice(request, prompt) for prompt in request.prompts for _ in range(n)]

    def envelope(self) -> dict[str, Any]:
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}
        if self.request.generation.n_status:
            body["n_status"] = self.request.generation.n_status
        return body

    def submits(self) -> list[p.Submit]:
        request, generation = self.request, self.request.generation
        submits = []
        for index, choice in enumerate(self.choices):
            sampling = sampling_for_choice(request.sampling, index % generation.n)
            text, ids = (choice.prompt, None) if isinstance(choice.prompt, str) else (None, choice.prompt)
            submits.append(
                p.Submit(
                    request_id=f"{self.id}-{index}",
                    model=self.model,
                    prompt=text,
                    prompt_token_ids=ids,
                    prompt_logprobs=request.prompt_logprobs(choice.prompt),
                    sampling=sampling,
                    max_tokens=request.max_tokens,
                    stop=generation.stop,
                    stop_token_ids=generation.stop_token_ids,
                    ignore_eos=generation.ignore_eos,
                    min_tokens=generation.min_tokens,
                    skip_special_tokens=generation.skip_special_tokens,
                )
            )
        return submits


def usage(request: CompletionRequest, generations: list[Generation]) -> dict[str, int]:
    """Each prompt counted once (its first choice's), every choice's completion tokens."""
    n = request.generation.n
    prompt = sum(g.finished.prompt_tokens for g in generations[::n])
    completion = sum(g.finished.completion_tokens for g in generations)
    cached = sum(g.finished.cached_tokens for g in generations[::n])
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


@only("POST")
async def completions(request):
    await arequire_client_token(request, operation="completion")
    body = parse_completion_request(request.body)
    router = get_router()
    router.begin_completion()
    streaming = False
    try:
        allow_load = load_allowed(request.headers)
        model = await router.route(body.model, allow_load=allow_load)
        completion = TextCompletion(body, model, router.placements()[model])
        try:
            generations = await admit_all(router.client, completion.submits())
        except EngineError as exc:
            error = as_api_error(exc)
            if body.generation.stream and isinstance(error, ContextOverBudget):
                return StreamingHttpResponse(
                    refused_stream(error), content_type="text/event-stream", headers=SSE_HEADERS
                )
            raise error from exc
        if body.generation.stream:
            streaming = True
            chunks = counted(router, stream(completion, generations))
            return StreamingHttpResponse(chunks, content_type="text/event-stream", headers=SSE_HEADERS)
        response = JsonResponse(await complete(completion, generations))
        if (weights := millm_model(completion.placement)) is not None:
            response[MILLM_MODEL_HEADER] = weights
        return response
    finally:
        if not streaming:
            router.end_completion()


async def complete(completion: TextCompletion, generations: list[Generation]) -> dict[str, Any]:
    choices = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            for generation in generations:
                await stack.enter_async_context(generation)
            for index, (choice, generation) in enumerate(zip(completion.choices, generations, strict=True)):
                texts, entries, scored = [], [], None
                async for event in generation:
                    if not isinstance(event, p.Tokens):
                        continue
                    if event.prompt_logprobs is not None:
                        scored = event.prompt_logprobs
                    texts.append(event.text)
                    entries += event.logprobs or []
                echo_text, echo_entries = choice.echo(scored) if completion.request.echo else ("", [])
                choices.append(
                    {
                        "index": index,
                        "text": echo_text + "".join(texts),
                        "logprobs": choice.logprobs(echo_entries + entries),
                        "finish_reason": generation.finished.finish_reason,
                    }
                )
    except EngineError as exc:
        raise as_api_error(exc) from exc
    return {**completion.envelope(), "choices": choices, "usage": usage(completion.request, generations)}


def which(completion: TextCompletion) -> dict[str, str]:
    """`millm_model` for a stream's terminal chunk."""
    value = millm_model(completion.placement)
    return {"millm_model": value} if value else {}


async def stream(completion: TextCompletion, generations: list[Generation]) -> AsyncIterator[bytes]:
    """One choice after another: its echo (when asked), a chunk per piece of text, a closing chunk with the finish
    reason; then the usage chunk (stream_options.include_usage) and [DONE]. `millm_model` rides the last chunk."""

    def chunk(index: int, text: str, logprobs: dict | None, finish_reason: str | None = None, **extra) -> bytes:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse({**completion.envelope(), "choices": [choice], **extra})

    request = completion.request
    async with contextlib.AsyncExitStack() as stack:
        for generation in generations:
            await stack.enter_async_context(generation)
        last = len(generations) - 1
        for index, (choice, generation) in enumerate(zip(completion.choices, generations, strict=True)):
            echoed = not request.echo or (isinstance(choice.prompt, str) and request.logprobs is None)
            if request.echo and echoed:
                yield chunk(index, choice.prompt, None)
            try:
                async for event in generation:
                    if not isinstance(event, p.Tokens):
                        continue
                    if event.prompt_logprobs is not None:
                        if not echoed:
                            text, entries = choice.echo(event.prompt_logprobs)
                            yield chunk(index, text, choice.logprobs(entries))
                            echoed = True
                        continue
                    if event.text or event.logprobs:
                        yield chunk(index, event.text, choice.logprobs(event.logprobs or []))
            except EngineError as exc:
                yield error_event(as_api_error(exc))
                return
            terminal = index == last and not request.generation.include_usage
            yield chunk(index, "", None, generation.finished.finish_reason, **(which(completion) if terminal else {}))
    if request.generation.include_usage:
        tail = {"choices": [], "usage": usage(request, generations), **which(completion)}
        yield sse({**completion.envelope(), **tail})
    yield sse("[DONE]")
