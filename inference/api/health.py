"""GET /: the cheapest route, answering "what am I running?"; GET /api/health/detailed: that, the served models (and
how far a running load has read) and the weights barrier's summary (docs/schemas/health-detailed.json)."""

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from inference.api.methods import only
from inference.api.model_rows import load_progress_fields
from inference.runtime.engine_client import installed_client
from inference.runtime.host_probe import backend, build_id, dies_visible
from inference.runtime.router import installed_router
from weights.status import health_summary


def health_fields() -> dict:
    """What GET / answers (and GET /api/health/detailed begins with): service, status, backend, build, accelerator,
    dies_visible."""
    client = installed_client()  # None in a process without the engine: still healthy, with 0 dies
    dies = dies_visible(client)
    return {
        "service": "pantheon",
        "status": "ok",
        "backend": backend(client),
        "build": build_id(),
        "accelerator": dies > 0,
        "dies_visible": dies,
    }


def _model_entry(name: str, placement) -> dict:
    """A served model's name and state, once loaded the C kernels its worker runs (`kernels`, empty where torch runs
    all of it), and while it loads how far it has read (`manage.py load_model`'s bar)."""
    entry = {"name": name, "state": placement.state}
    if placement.info is not None:
        entry["kernels"] = placement.info.kernels
    if (progress := load_progress_fields(placement.load_progress)) is not None:
        entry["load_progress"] = progress
    return entry


@only("GET")
async def health(request):
    """Always 200."""
    return JsonResponse(health_fields())


@only("GET")
async def health_detailed(request):
    """No token: GET /'s fields, every served model's name and state, and the weights summary (weights/status.py)."""
    router = installed_router()
    try:
        weights = await sync_to_async(health_summary)(router)
    except Exception as exc:  # the spec: "or error when they could not be read"
        weights = {"error": f"{type(exc).__name__}: {exc}"}
    models = [] if router is None else [_model_entry(n, pl) for n, pl in sorted(router.placements().items())]
    return JsonResponse({**health_fields(), "models": models, "weights": weights})
