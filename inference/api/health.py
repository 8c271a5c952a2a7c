"""GET /: the cheapest route, answering "what am I running?"; GET /api/health/detailed: that, the served models (and
how far a running load has read) and the sections the apps above add, the weights barrier's summary among them
(docs/schemas/health-detailed.json)."""

from asgiref.sync import sync_to_async
from django.http import JsonResponse

from inference.runtime.router import installed_router
from inference.services.model_rows import load_progress_fields
from inference.services.serving import health_fields
from pantheon_site.health_sections import health_sections
from pantheon_site.methods import only


def _model_entry(name: str, placement) -> dict:
    """A served model's name and state, once loaded the C kernels its worker runs (`kernels`, empty where torch runs
    all of it), and while it loads how far it has read (`manage.py load_model`'s bar)."""
    entry = {"name": placement.served_name, "state": placement.state}  # a model's replicas: its name once each
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
    """No token: GET /'s fields, every served model's name and state, and the sections the apps above add
    (pantheon_site/health_sections.py: `weights`, the barrier summary of weights/status.py)."""
    router = installed_router()
    sections = await sync_to_async(health_sections)(router)
    models = [] if router is None else [_model_entry(n, pl) for n, pl in sorted(router.placements().items())]
    return JsonResponse({**health_fields(), "models": models, **sections})
