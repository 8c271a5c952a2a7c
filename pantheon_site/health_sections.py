"""The sections an app adds to GET /api/health/detailed (the weights app's barrier summary), so the health route
(inference/api/health.py) reports them without importing the apps above it: each app registers its summary when
Django readies it (its AppConfig.ready)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Summary = Callable[[Any], dict[str, Any]]  # the installed router (None without one) -> the section's fields

_sections: dict[str, Summary] = {}


def add_health_section(name: str, summary: Summary) -> None:
    """Reports `summary(router)` under `name` in every detailed health answer."""
    _sections[name] = summary


def health_sections(router: Any) -> dict[str, dict[str, Any]]:
    """Every registered section for `router`; one that could not be read says why (`error`) rather than failing
    the whole answer (the spec: "or error when they could not be read")."""
    out: dict[str, dict[str, Any]] = {}
    for name, summary in _sections.items():
        try:
            out[name] = summary(router)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out
