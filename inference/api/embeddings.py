"""POST /v1/embeddings: OpenAI's embeddings on any loaded model.

An embedding is the input's final hidden states (after the last norm), pooled by the load's `pooling` option (the
mean over positions, or the last token's) and L2-normalised; the worker computes it between generation steps. Each
input is a text (tokenized as it is, with the BOS) or token ids. `encoding_format: base64` sends each vector as the
base64 of its little-endian float32 bytes, as OpenAI does; `dimensions` is accepted only when it is the model's own
(these models do not shorten their vectors). `X-Pantheon-Priority: batch` (a batch's line) is refused with 503
weights_held while a trainer holds the weights; an embedding runs in no queue, so priority changes nothing else.
"""

from __future__ import annotations

import base64
import struct

from django.http import JsonResponse

from inference.api.completion_requests import parse_embedding_request
from inference.api.priority import request_priority
from inference.runtime.generation import EngineError
from inference.runtime.router import get_router, load_allowed
from inference.services.refusals import as_api_error
from pantheon_site.auth import arequire_client_token
from pantheon_site.errors import InvalidRequest
from pantheon_site.methods import only
from pantheon_site.request_metrics import label_model


@only("POST")
async def embeddings(request):
    await arequire_client_token(request, operation="embedding")
    body = parse_embedding_request(request.body)
    priority = request_priority(request.headers)
    router = get_router()
    allow_load = load_allowed(request.headers)
    model = await router.route(body.get("model") or "", allow_load=allow_load)
    label_model(request, model)
    placement = router.acquire(model)
    try:
        reply = await router.client.embed(placement.name, body["input"], priority=priority)
    except EngineError as exc:
        raise as_api_error(exc) from exc
    finally:
        router.release(placement)
    size = len(reply.vectors[0]) // 4
    if body.get("dimensions") not in (None, size):
        raise InvalidRequest(
            f"dimensions must be {size} for model {model!r} (its vectors are not shortened)", reason="dimensions"
        )
    data = []
    for index, vector in enumerate(reply.vectors):
        if body["encoding_format"] == "base64":
            embedding = base64.b64encode(vector).decode()
        else:
            embedding = list(struct.unpack(f"<{len(vector) // 4}f", vector))
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(reply.prompt_tokens)
    return JsonResponse(
        {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    )
