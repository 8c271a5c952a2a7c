"""GET /: the cheapest route, answering "what am I running?"."""

from django.http import JsonResponse

from inference.api.methods import only
from inference.runtime.engine_client import installed_client
from inference.runtime.host_probe import backend, build_id, dies_visible


@only("GET")
async def health(request):
    """Always 200: service, status, backend, build, accelerator, dies_visible."""
    client = installed_client()  # None in a process without the engine: still healthy, with 0 dies
    dies = dies_visible(client)
    return JsonResponse({"service": "pantheon", "status": "ok", "backend": backend(client), "build": build_id(),
                         "accelerator": dies > 0, "dies_visible": dies})  # fmt: skip
