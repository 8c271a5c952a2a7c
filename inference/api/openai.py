"""The OpenAI-compatible routes: GET /v1/models and POST /v1/chat/completions (JSON, or SSE with stream: true).

The hot path is async end to end and reads no database (unless PANTHEON_REQUIRE_CLIENT_TOKENS is set): validate
the body, route it in memory, submit to the worker, and answer from the token stream. A refusal the worker
decides at admission (busy, over the window) still has its own status; once an SSE stream has opened, an error is
its terminal event. context_over_budget on a streaming request is sent in its stream form (a 200 stream whose
only event is the error, with kv_used/kv_cap), as the spec describes it for streaming clients.

`n` choices are n generations submitted together (see `submit_choices`). Every completion is counted in flight
from validation to its last byte, so a graceful shutdown can refuse new ones (503 server_shutting_down) and wait
for these.
"""

import asyncio
from collections.abc import AsyncIterator

from django.http import JsonResponse, StreamingHttpResponse

from inference.api.completion_bodies import CompletionContext, complete, refused_stream, stream_chunks
from inference.api.model_rows import v1_model_row
from inference.api.refusals import as_api_error
from inference.api.serializers import ChatRequest, parse_chat_request
from inference.engine.contract.messages import Submit
from inference.runtime.engine_client import EngineClient
from inference.runtime.generation import EngineError, Generation
from inference.runtime.host_probe import backend, build_id
from inference.runtime.router import ModelRouter, get_router, load_allowed
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import ContextOverBudget, NoModelsLoaded
from pantheon_site.methods import only

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MILLM_MODEL_HEADER = "X-miLLM-Model"


@only("GET")
async def list_models(request):
    """Served models, one entry per name, with the served concurrency and the effective context window."""
    await arequire_client_token(request, operation="models_list")
    try:
        router = get_router()
    except NoModelsLoaded:
        return JsonResponse({"object": "list", "backend": backend(None), "build": build_id(), "data": []})
    placements = router.placements()
    data = [v1_model_row(placements[name]) for name in router.serving_names()]
    client = router.client
    return JsonResponse({"object": "list", "backend": backend(client), "build": build_id(), "data": data})


@only("POST")
async def chat_completions(request):
    await arequire_client_token(request, operation="chat_completion")
    chat = parse_chat_request(request.body, request.headers)
    router = get_router()
    router.begin_completion()
    streaming = False
    try:
        allow_load = load_allowed(request.headers)
        model = await router.route(chat.model, allow_load=allow_load)
        placement = router.placements()[model]
        ctx = CompletionContext(chat, model, placement.info, placement)
        try:
            generations = await submit_choices(router.client, chat, model, ctx.id)
        except EngineError as exc:
            error = as_api_error(exc)
            if chat.generation.stream and isinstance(error, ContextOverBudget):
                return StreamingHttpResponse(refused_stream(error), content_type="text/event-stream",
                                             headers=SSE_HEADERS)  # fmt: skip
            raise error from exc
        if chat.generation.stream:
            streaming = True
            body = counted(router, stream_chunks(generations, ctx))
            return StreamingHttpResponse(body, content_type="text/event-stream", headers=SSE_HEADERS)
        response = JsonResponse(await complete(generations, ctx))
        if (weights := ctx.millm_model()) is not None:
            response[MILLM_MODEL_HEADER] = weights
        return response
    finally:
        if not streaming:
            router.end_completion()


async def submit_choices(client: EngineClient, chat: ChatRequest, model: str, completion_id: str) -> list[Generation]:
    """Submits one generation per choice and waits for their admission (`admit_all`).

    The session key goes with the first choice only (spec: only the first uses the session's prefix cache); a model
    that keeps no sessions ignores it."""
    submits = [
        Submit(
            request_id=completion_id if chat.generation.n == 1 else f"{completion_id}-{i}",
            model=model,
            messages=chat.messages,
            tools=chat.tool_plan.tools,
            tool_grammar=chat.tool_plan.grammar,
            tool_function=chat.tool_plan.function,
            enable_thinking=chat.enable_thinking,
            sampling=chat.sampling_for_choice(i),
            max_tokens=chat.max_tokens,
            stop=chat.generation.stop,
            stop_token_ids=chat.generation.stop_token_ids,
            ignore_eos=chat.generation.ignore_eos,
            min_tokens=chat.generation.min_tokens,
            skip_special_tokens=chat.generation.skip_special_tokens,
            session_id=chat.session_id if i == 0 else None,
            reasoning_budget=chat.reasoning_budget,
        )
        for i in range(chat.generation.n)
    ]
    return await admit_all(client, submits)


async def admit_all(client: EngineClient, submits: list[Submit]) -> list[Generation]:
    """Submits every generation at once (they decode side by side) and waits for their admission. If any is
    refused the others are aborted and the refusal is raised; a cancelled wait aborts them all."""
    results = await asyncio.gather(*(client.generate(submit) for submit in submits), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for generation in results:
            if isinstance(generation, Generation):
                generation.abort()
        raise failures[0]
    return list(results)


async def counted(router: ModelRouter, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, counted as a completion in flight until the stream ends (however it ends)."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        router.end_completion()
