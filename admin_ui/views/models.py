"""The models page: the catalogue (register a path, edit its default load options, remove it, load it), the served
instances (live, with unload), and a load with every option the API has.

Loads and unloads run the same service functions as POST /admin/models/load and /unload, audited as model_load and
model_unload with the signed-in user as actor. Each runs shielded from the request: a browser that goes away while
a load runs does not cancel the load, and its audit event is still written.
"""

import asyncio

from asgiref.sync import sync_to_async
from django.conf import settings
from django.views.decorators.http import require_POST

from admin_ui.load_form import load_body, option_inputs, options_of
from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from inference.models import CatalogModel, InstanceState, ModelInstance
from inference.services.catalogue import checkpoint_at, do_catalogue_model, do_remove_catalogue_model
from inference.services.model_lifecycle import LoadRequest, do_load_model, do_unload_model
from inference.services.model_rows import instance_rows
from inference.services.serving import router_if_serving, serving_router
from pantheon_site.errors import PantheonError


def _stored_rows():
    catalogue = [(model, option_inputs(model.load_options)) for model in CatalogModel.objects.order_by("name")]
    failures = list(ModelInstance.objects.filter(state=InstanceState.FAILED).order_by("-updated_at")[:10])
    return catalogue, failures


async def _instances() -> list[dict]:
    serving = router_if_serving()
    return await instance_rows(serving) if serving is not None else []


async def _render(request, notices: list[Notice] | None = None):
    catalogue, failures = await sync_to_async(_stored_rows)()
    return common.page(
        request, "admin_ui/models.html", "models", notices,
        catalogue=catalogue, failures=failures, instances=await _instances(), options=option_inputs(),
        serving=router_if_serving() is not None, drain_timeout=settings.PANTHEON_UNLOAD_DRAIN_TIMEOUT_S,
    )  # fmt: skip


async def page(request):
    return await _render(request)


async def live(request):
    """The instances table alone, which the page polls while it is open."""
    return common.page(request, "admin_ui/models_live.html", "models", instances=await _instances(),
                       drain_timeout=settings.PANTHEON_UNLOAD_DRAIN_TIMEOUT_S, unload_button=True)  # fmt: skip


async def _shielded(request, action, failed: str, done):
    """Runs `action` (a coroutine function) as a task the request's cancellation does not reach, then renders the
    page with `done(result)` as its notice, or `failed` and the error's message."""
    try:
        result = await asyncio.shield(asyncio.ensure_future(action()))
    except PantheonError as error:
        return await _render(request, [Notice(f"{failed}: {error.message}", "error")])
    return await _render(request, [Notice(done(result))])


@require_POST
async def load(request):
    async def audited_load():
        async with ui_call(request, "model_load") as call:
            body = load_body(request.POST)
            call.model = body.get("name") or body["path"]
            row = await do_load_model(serving_router(), LoadRequest.from_body(body))
            call.model = row["id"]
            call.details = {"path": row["path"], "device": row["device"], "instance_id": row.get("instance_id")}
            return row

    return await _shielded(
        request, audited_load, "The load failed", lambda row: f"Loaded {row['id']} on {row['device']}."
    )


@require_POST
async def unload(request):
    """A row's Unload: that instance (its id), so a replica's button leaves the model's other replicas serving."""
    name = request.POST.get("name", "")
    instance_id = int(request.POST["instance_id"]) if request.POST.get("instance_id", "").isdigit() else None

    async def audited_unload():
        async with ui_call(request, "model_unload", model=name) as call:
            result = await do_unload_model(serving_router(), name=name, instance_id=instance_id)
            call.details = {k: v for k, v in result.items() if k != "unloaded"}
            return result

    return await _shielded(
        request, audited_unload, "The unload failed", lambda result: f"Unloaded {result['unloaded']}."
    )


def _save_catalogue_entry(request) -> CatalogModel:
    with ui_call(request, "catalogue_save") as call:
        body = load_body(request.POST)
        checkpoint = checkpoint_at(body["path"])
        name = body.get("name") or checkpoint.default_name
        call.model = name
        model = do_catalogue_model(name, checkpoint, options_of(body), device=body.get("device", ""))
        call.details = {"path": model.path}
        return model


@require_POST
async def catalogue_save(request):
    try:
        model = await sync_to_async(_save_catalogue_entry)(request)
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Saved {model.name} in the catalogue.")])


def _remove_catalogue_entry(request, name: str) -> None:
    with ui_call(request, "catalogue_remove", model=name):
        do_remove_catalogue_model(name)


@require_POST
async def catalogue_remove(request):
    name = request.POST.get("name", "")
    try:
        await sync_to_async(_remove_catalogue_entry)(request, name)
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice(f"Removed {name} from the catalogue.")])
