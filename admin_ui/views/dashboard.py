"""The dashboard: health, each device's memory, each served instance; its live part is a cheap partial the page
polls (no database query: everything comes from the router and the workers' status replies)."""

from admin_ui.views import common
from inference.services import serving
from inference.services.model_rows import instance_rows


async def _snapshot() -> dict:
    router = serving.router_if_serving()
    if router is None:
        return {"health": serving.health_fields(), "devices": [], "instances": [], "serving": False}
    devices = await serving.device_rows(router)
    return {"health": serving.health_fields(), "devices": devices, "instances": await instance_rows(router),
            "serving": True}  # fmt: skip


async def page(request):
    return common.page(request, "admin_ui/dashboard.html", "dashboard", **await _snapshot())


async def live(request):
    return common.page(request, "admin_ui/dashboard_live.html", "dashboard", **await _snapshot())
