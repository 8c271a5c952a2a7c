"""The dashboard: health, each device's memory, each served instance, and the last 15 minutes of each model in
charts; its live part is a cheap partial the page polls, the charts a JSON of points it polls (no database query:
everything comes from the router, the workers' status replies and the control plane's metrics history)."""

from django.http import JsonResponse

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


async def charts(request):
    """The charts' points (inference/services/serving.py's chart_series), which admin_ui/static/admin_ui/charts.js
    draws."""
    return JsonResponse(serving.chart_series())
