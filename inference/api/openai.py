"""The OpenAI-compatible routes: GET /v1/models and POST /v1/chat/completions (JSON, or SSE with stream: true).

A chat completion reads no database (unless PANTHEON_REQUIRE_CLIENT_TOKENS is set): its body is validated
(chat_requests.py) and run on the generation routes' skeleton (generation_route.py); `n` choices are n generations
submitted together.
"""

from collections.abc import AsyncIterator
from typing import Any

from django.http import JsonResponse

from inference.api.chat_requests import ChatRequest, parse_chat_request
from inference.api.completion_bodies import CompletionContext, complete, stream_chunks
from inference.api.generation_route import GenerationRun, run_generation
from inference.engine.contract.messages import Submit
from inference.runtime.client_protocol import ModelPlacement
from inference.runtime.generation import Generation
from inference.runtime.host_probe import backend, build_id
from inference.runtime.router import get_router
from inference.services.model_rows import v1_model_row
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import NoModelsLoaded
from pantheon_site.methods import only


@only("GET")
async def list_models(request):
    """Served models, one entry per served name (replicas deduplicated, spec: one logical id; the row is the first
    replica's), with the served concurrency and the effective context window."""
    await arequire_client_token(request, operation="models_list")
    try:
        router = get_router()
    except NoModelsLoaded:
        return JsonResponse({"object": "list", "backend": backend(None), "build": build_id(), "data": []})
    data = [v1_model_row(router.first_serving(name)) for name in router.serving_names()]
    client = router.client
    return JsonResponse({"object": "list", "backend": backend(client), "build": build_id(), "data": data})


class ChatRun(GenerationRun):
    """A chat completion on the generation skeleton: `n` choices, one generation each, answered by
    completion_bodies.py's chat.completion body or its chunks."""

    def __init__(self, chat: ChatRequest):
        self.chat = chat
        self.requested_model = chat.model
        self.stream = chat.delivery.stream
        self.ctx: CompletionContext | None = None

    def session_key(self) -> str | None:
        return self.chat.session_id

    def place(self, model: str, placement: ModelPlacement) -> None:
        self.ctx = CompletionContext(self.chat, model, placement.info, placement)

    def submits(self) -> list[Submit]:
        return self.chat.submits(self.ctx.model, self.ctx.id)

    async def complete(self, generations: list[Generation]) -> dict[str, Any]:
        return await complete(generations, self.ctx)

    def events(self, generations: list[Generation]) -> AsyncIterator[bytes]:
        return stream_chunks(generations, self.ctx)


@only("POST")
async def chat_completions(request):
    await arequire_client_token(request, operation="chat_completion")
    return await run_generation(request, ChatRun(parse_chat_request(request.body, request.headers)))
