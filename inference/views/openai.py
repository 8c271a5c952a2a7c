"""The OpenAI-compatible routes: GET /v1/models and POST /v1/chat/completions (JSON, or SSE with stream: true).

The hot path is async end to end and reads no database (unless PANTHEON_REQUIRE_CLIENT_TOKENS is set): validate
the body, route it in memory, submit to the worker, and answer from the token stream. A refusal the worker
decides at admission (busy, over the window) still has its own status; once an SSE stream has opened, an error is
its terminal event. context_over_budget on a streaming request is sent in its stream form (a 200 stream whose
only event is the error, with kv_used/kv_cap), as the spec describes it for streaming clients.
"""

from django.http import JsonResponse, StreamingHttpResponse

from inference.completions import CompletionContext, complete, refused_stream, stream_chunks
from inference.dispatcher import LOAD_POLICY_HEADER, get_dispatcher
from inference.engine_client import EngineError
from inference.engine_errors import as_api_error
from inference.host_info import backend, build_id
from inference.model_rows import v1_model_row
from inference.serializers import parse_chat_request
from inference.views.methods import only
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import ContextOverBudget, NoModelsLoaded

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@only("GET")
async def list_models(request):
    """Served models, one entry per name, with the served concurrency and the effective context window."""
    await arequire_client_token(request, operation="models_list")
    try:
        dispatcher = get_dispatcher()
    except NoModelsLoaded:
        return JsonResponse({"object": "list", "backend": backend(None), "build": build_id(), "data": []})
    placements = dispatcher.placements()
    data = [v1_model_row(placements[name], dispatcher.served.get(name)) for name in dispatcher.serving_names()]
    client = dispatcher.client
    return JsonResponse({"object": "list", "backend": backend(client), "build": build_id(), "data": data})


@only("POST")
async def chat_completions(request):
    await arequire_client_token(request, operation="chat_completion")
    chat = parse_chat_request(request.body)
    dispatcher = get_dispatcher()
    allow_load = request.headers.get(LOAD_POLICY_HEADER, "").strip().lower() != "refuse"
    model = await dispatcher.route(chat.model, allow_load=allow_load)
    ctx = CompletionContext(chat, model)
    try:
        generation = await dispatcher.client.generate(
            model,
            messages=chat.messages,
            tools=chat.tools,
            enable_thinking=chat.enable_thinking,
            sampling=chat.sampling,
            max_tokens=chat.max_tokens,
            stop=chat.stop,
            request_id=ctx.id,
        )
    except EngineError as exc:
        error = as_api_error(exc)
        if chat.stream and isinstance(error, ContextOverBudget):
            return StreamingHttpResponse(refused_stream(error), content_type="text/event-stream", headers=SSE_HEADERS)
        raise error from exc
    if chat.stream:
        return StreamingHttpResponse(stream_chunks(generation, ctx), content_type="text/event-stream",
                                     headers=SSE_HEADERS)  # fmt: skip
    return JsonResponse(await complete(generation, ctx))
