"""The one way a generation route runs (chat completions, legacy completions, responses): each route parses its
body into a `GenerationRun`, which supplies only what differs (its submissions and its bodies), and `run_generation`
does the rest in the same order for all three.

The hot path is async end to end and reads no database: route the request to a served model in memory, submit
every choice at once and wait for their admission, then answer from the token streams, as one JSON body or as SSE.
A refusal the worker decides at admission (busy, over the window) still has its own status; once an SSE stream has
opened, an error is its terminal event (each route's body writes it). context_over_budget on a streaming chat or
completion request is sent in its stream form (a 200 stream whose only event is the error, with kv_used/kv_cap), as
the spec describes it for streaming clients. A JSON answer names the weights that produced it (X-miLLM-Model; a
stream carries it on its terminal event). Every generation is counted in flight from routing to its last byte, so a
graceful shutdown can refuse new ones (503 server_shutting_down) and wait for these, and on the replica the router
acquired for it, so the next request goes to the least busy one (inference/runtime/router.py). A generation refused at
admission counts once in pantheon_refusals_total by the engine's reason (queue_full, queue_timeout, low_memory,
prompt_too_long, model_reloading, ...), here only, and the request's metrics name the model it was routed to.
A request sent with `X-Pantheon-Priority: batch` (the Batch API's lines) runs at batch priority (api/priority.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse

from fleet.prefix_hashes import record_served
from inference.api.completion_bodies import millm_model, refused_stream
from inference.api.priority import request_priority
from inference.engine.contract import messages as p
from inference.engine.contract.metrics import REFUSALS
from inference.runtime.client_protocol import EngineClient, ModelPlacement
from inference.runtime.generation import EngineError, Generation
from inference.runtime.router import ModelRouter, get_router, load_allowed
from inference.services.refusals import as_api_error
from pantheon_site.errors import ContextOverBudget
from pantheon_site.request_metrics import label_model

logger = logging.getLogger("pantheon.generation")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MILLM_MODEL_HEADER = "X-miLLM-Model"


class GenerationRun(ABC):
    """One validated generation request, as a route shapes it: the served name it asks for (`requested_model`), and
    whether it streams. `place` is told the model it was routed to before `submits` is asked for the SUBMITs."""

    requested_model: str
    stream: bool
    stream_refusals = True  # context_over_budget on a streaming request is answered as a one-event stream

    def session_key(self) -> str | None:
        """The request's session key, which sends it to the replica holding that session (None: any replica)."""
        return None

    @abstractmethod
    def place(self, model: str, placement: ModelPlacement) -> None: ...

    @abstractmethod
    def submits(self) -> list[p.Submit]: ...

    @abstractmethod
    async def complete(self, generations: list[Generation]) -> dict[str, Any]:
        """The JSON body, once every generation ended (raises the API error of a failure)."""

    @abstractmethod
    def events(self, generations: list[Generation]) -> AsyncIterator[bytes]:
        """The SSE events, to the end of the stream (a failure is its terminal event)."""


async def run_generation(request, run: GenerationRun) -> HttpResponse:
    """Routes `run`, submits it at the request's priority (X-Pantheon-Priority), and answers it as JSON or as a
    stream (see the module docstring)."""
    priority = request_priority(request.headers)
    router = get_router()
    router.begin_completion()
    streaming = False
    placement: ModelPlacement | None = None
    try:
        model = await router.route(run.requested_model, allow_load=load_allowed(request.headers))
        label_model(request, model)
        placement = router.acquire(model, run.session_key())
        run.place(model, placement)
        # The worker knows the replica by its key; the bodies keep the served name.
        submits = [msgspec.structs.replace(submit, model=placement.name, priority=priority) for submit in run.submits()]
        if settings.PANTHEON_LOG_SENSITIVE:
            log_prompts(submits)
        try:
            generations = await admit_all(router.client, submits)
        except EngineError as exc:
            REFUSALS.labels(model, exc.reason).inc()
            error = as_api_error(exc)
            if run.stream and run.stream_refusals and isinstance(error, ContextOverBudget):
                return StreamingHttpResponse(refused_stream(error), content_type="text/event-stream",
                                             headers=SSE_HEADERS)  # fmt: skip
            raise error from exc
        if settings.PANTHEON_REGISTRY_URL:
            record_served(placement.served_name, request.body)  # what the heartbeat reports (fleet/prefix_hashes.py)
        if run.stream:
            streaming = True
            body = counted(router, placement, run.events(generations))
            return StreamingHttpResponse(body, content_type="text/event-stream", headers=SSE_HEADERS)
        response = JsonResponse(await run.complete(generations))
        if (weights := millm_model(placement)) is not None:
            response[MILLM_MODEL_HEADER] = weights
        return response
    finally:
        if not streaming:
            if placement is not None:
                router.release(placement)
            router.end_completion()


def log_prompts(submits: list[p.Submit]) -> None:
    """Each generation's prompt, as the worker gets it: only with PANTHEON_LOG_SENSITIVE, a debug setting (prompt text
    is the client's, never logged otherwise; docs/logging.md)."""
    for submit in submits:
        prompt = submit.prompt if submit.prompt is not None else submit.messages or submit.prompt_token_ids
        logger.info("generation %s prompt: %s", submit.request_id, json.dumps(prompt, ensure_ascii=False))


async def admit_all(client: EngineClient, submits: list[p.Submit]) -> list[Generation]:
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


async def counted(router: ModelRouter, placement: ModelPlacement, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, counted as a completion in flight (and on its replica) until the stream ends (however it ends)."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        router.release(placement)
        router.end_completion()
