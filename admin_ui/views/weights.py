"""The weights page: the attachment panel (GET /api/weights/status's fields), each served model's weights, clear-stale,
and the checkpoint lineage as a tree (every saved checkpoint under its parent, with its sha256 and who saved it).

Clear-stale runs the barrier call the route runs (weights/services.call_barrier), as an operator, audited as
weights_clear_stale with the signed-in user as actor.
"""

from asgiref.sync import sync_to_async
from django.views.decorators.http import require_POST

from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from inference.engine.contract.weights import WeightsOperation
from inference.services.serving import router_if_serving, serving_router
from pantheon_site.errors import PantheonError
from pantheon_site.models import Role
from weights import services
from weights.model_choice import default_placement, served_placements
from weights.models import Checkpoint
from weights.status import model_status, status_body


def _checkpoint_tree() -> list[dict]:
    """The saved checkpoints as trees: each root (saved from a base model) with its descendants under it."""
    rows = list(Checkpoint.objects.order_by("created_at", "id"))
    children: dict[int | None, list[Checkpoint]] = {}
    for row in rows:
        children.setdefault(row.parent_id, []).append(row)

    def node(row: Checkpoint, seen: frozenset[int]) -> dict:
        below = [node(child, seen | {row.pk}) for child in children.get(row.pk, []) if child.pk not in seen]
        return {"checkpoint": row, "children": below}

    return [node(root, frozenset()) for root in children.get(None, [])]


def _panel() -> dict:
    """The attachment panel shows the default model (the attached one, else the only attachable one); the table
    below it every served model's weights, since with several served no one of them is the default."""
    router = router_if_serving()
    status, models = None, []
    if router is not None:
        status = status_body(router, default_placement(router))
        models = [model_status(router, placement) for placement in served_placements(router).values()]
    return {"status": status, "models": models, "tree": _checkpoint_tree(), "serving": router is not None}


async def _render(request, notices: list[Notice] | None = None):
    return common.page(request, "admin_ui/weights.html", "weights", notices, **await sync_to_async(_panel)())


async def page(request):
    return await _render(request)


@require_POST
async def clear_stale(request):
    try:
        async with ui_call(request, "weights_clear_stale") as call:
            record = services.CallRecord()
            await services.call_barrier(
                serving_router(), WeightsOperation.CLEAR_STALE, role=Role.OPERATOR,
                label=request.user.get_username(), record=record,
            )  # fmt: skip
            call.model = record.model
    except PantheonError as error:
        return await _render(request, [Notice(error.message, "error")])
    return await _render(request, [Notice("Cleared the stale attachment.")])
