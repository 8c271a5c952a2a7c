"""What this process serves, as the operator's pages and GET / read it, and the router the services act on.

The UI reads and acts only through the services: it finds the running router here (none in a process that runs no
engine, such as `runserver`: a page then shows nothing served), reads the rows the API answers with
(inference/services/model_rows.py) and GET /'s health fields, and passes the router to the service functions.
"""

from __future__ import annotations

from typing import Any

from inference.runtime.client_protocol import installed_client
from inference.runtime.host_probe import backend, build_id, dies_visible
from inference.runtime.metrics_history import installed_history
from inference.runtime.router import ModelRouter, get_router, installed_router


def serving_router() -> ModelRouter:
    """The router the services act on; 503 no_models_loaded when the engine does not run in this process."""
    return get_router()


def router_if_serving() -> ModelRouter | None:
    """The router, or None when the engine does not run in this process (a page then shows nothing served)."""
    return installed_router()


def health_fields() -> dict[str, Any]:
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


async def device_rows(router: ModelRouter) -> list[dict[str, Any]]:
    """Each worker's device as the dashboard shows it: its process, memory (used, total, percent) and models."""
    statuses = sorted(await router.client.status(), key=lambda status: status.device)
    return [
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


def chart_series() -> dict[str, Any]:
    """The dashboard's charts: the last 15 minutes of each model the engine holds now (the history's JSON,
    inference/runtime/metrics_history.py); no model and no points in a process that runs no engine."""
    history, router = installed_history(), installed_router()
    if history is None or router is None:
        return {"interval_s": None, "window_s": None, "t": [], "models": {}}
    return history.series(sorted(router.placements()))
