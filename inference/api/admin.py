"""The operator routes: GET /admin/models, POST /admin/models/load, POST /admin/models/unload, GET /admin/dies.

Each needs an operator token (or the local credential `manage.py` reads from the run file) and writes one audit
event, accepted or refused (inference/api/operator_auth.py); a view names the model it acted on on `request.audit`.
The work itself is in inference/services/model_lifecycle.py.
"""

from django.http import JsonResponse

from inference.api.operator_auth import admin_route
from inference.api.serializers import UnloadModelSerializer, parse_body, parse_json_object
from inference.runtime.host_probe import dies_visible
from inference.runtime.router import get_router
from inference.services.load_body import validate_load_body
from inference.services.model_lifecycle import LoadRequest, do_load_model, do_unload_model
from inference.services.model_rows import instance_rows
from pantheon_site.methods import only


@only("GET")
@admin_route("model_list")
async def list_instances(request):
    """Every live instance, one row each (not deduplicated by name), with the scheduler's current occupancy."""
    return JsonResponse({"object": "list", "data": await instance_rows(get_router())})


@only("POST")
@admin_route("model_load")
async def load(request):
    body = validate_load_body(parse_json_object(request.body))
    request.audit.model = body.get("name") or body["path"]
    row = await do_load_model(get_router(), LoadRequest.from_body(body))
    request.audit.model = row["id"]
    request.audit.details = {"path": row["path"], "device": row["device"], "instance_id": row.get("instance_id")}
    return JsonResponse(row)


@only("POST")
@admin_route("model_unload")
async def unload(request):
    body = parse_body(UnloadModelSerializer, request.body)
    request.audit.model = body.get("name", "")
    result = await do_unload_model(get_router(), name=body.get("name", ""), instance_id=body.get("id"))
    request.audit.model = result["unloaded"]
    request.audit.details = {k: v for k, v in result.items() if k != "unloaded"}
    return JsonResponse(result)


@only("GET")
@admin_route("die_list")
async def list_dies(request):
    """One row per CUDA device a worker runs on: its memory and the models on it. A CPU-only host has none."""
    router = get_router()
    statuses = sorted(
        (s for s in await router.client.status() if s.device.startswith("cuda:")),
        key=lambda s: int(s.device.split(":", 1)[1]),
    )
    data = []
    placements = router.placements()
    for status in statuses:
        ordinal = int(status.device.split(":", 1)[1])
        # a replica by its served name: two replicas on one die are that name twice
        names = [placements[m.name].served_name if m.name in placements else m.name for m in status.models]
        data.append({"die": ordinal, "card": ordinal, "model": ", ".join(names), "n_models": len(names),
                     "vram_budget": status.memory_total, "vram_used": status.memory_used})  # fmt: skip
    n_dies = max(len(data), dies_visible(router.client))
    return JsonResponse({"object": "list", "n_dies": n_dies, "data": data})
