"""The dashboard: health, each device's memory, each served instance; its live part is a cheap partial the page
polls (no database query: everything comes from the router and the workers' status replies)."""

from admin_ui.views import common
from inference.api.health import health_fields
from inference.api.model_rows import instance_rows
from inference.runtime.router import installed_router


async def _snapshot() -> dict:
    router = installed_router()
    if router is None:
        return {"health": health_fields(), "devices": [], "instances": [], "serving": False}
    statuses = sorted(await router.client.status(), key=lambda status: status.device)
    devices = [
        {
            "device": status.device,
            "pid": status.pid,
            "memory_total": status.memory_total,
            "memory_used": status.memory_used,
            "percent": round(100 * status.memory_used / status.memory_total) if status.memory_total else 0,
            "models": [model.name for model in status.models],
        }
        for status in statuses
    ]
    return {"health": health_fields(), "devices": devices, "instances": await instance_rows(router), "serving": True}


async def page(request):
    return common.page(request, "admin_ui/dashboard.html", "dashboard", **await _snapshot())


async def live(request):
    return common.page(request, "admin_ui/dashboard_live.html", "dashboard", **await _snapshot())
