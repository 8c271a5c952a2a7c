"""GET /: the cheapest route, answering "what am I running?"."""

from django.http import JsonResponse

from inference.api.methods import only
from inference.runtime.engine_client import EngineError, get_client
from inference.runtime.host_probe import backend, build_id, dies_visible


def _client_or_none():
    try:
        return get_client()
    except EngineError:  # no engine in this process (e.g. a management shell): still healthy, with 0 dies
        return None


@only("GET")
async def health(request):
    """Always 200: service, status, backend, build, accelerator, dies_visible."""
    client = _client_or_none()
    dies = dies_visible(client)
    return JsonResponse({"service": "pantheon", "status": "ok", "backend": backend(client), "build": build_id(),
                         "accelerator": dies > 0, "dies_visible": dies})  # fmt: skip
