"""GET /api/weights/status and the weights summary of /api/health/detailed, from the barrier snapshots the control
plane keeps: no token, no slot, no call to a worker. Neither ever holds the attachment id or a token.

A status answers for one model (`model`: its served name); without a model named, the top level is the default
model's (weights/model_choice.py; the idle body when there is none) and `models` lists every served model's.
"""

from __future__ import annotations

from typing import Any

from inference.engine.contract.weights import AttachmentInfo
from inference.models import CatalogModel
from inference.runtime.engine_client import ModelPlacement
from inference.runtime.router import ModelRouter
from weights.model_choice import default_placement, served_placements
from weights.times import iso, with_iso_times

# Fields beyond the spec's table that only a resident model has: null while nothing is resident.
RESIDENT_ONLY = (
    "served_name",
    "origin",
    "commits",
    "unsaved_commits",
    "transition",
    "attachable",
    "not_attachable_reason",
    "layout",
    "forward_steps",
)
# No adapters exist here yet: the adapter block says so rather than being null ("null only when it could not be
# read").
NO_ADAPTER = {"applied": False, "name": None}


def _idle_body() -> dict[str, Any]:
    """The status while nothing is resident: every field null or idle."""
    return {
        "attached": False,
        "attachment": None,
        "barrier": "serving",
        "quiesced_at": None,
        "held_requests": None,
        "weights_state": "clean",
        "resident_model": None,
        "steps_since_load": None,
        "last_save": None,
        "commit": None,
        "commit_overran": None,
        "last_hold_timeout_at": None,
        "last_overrun": None,
        "pause_unavailable": None,
        "adapter": NO_ADAPTER,
        "cuda_memory": None,
        "exports_since_start": 0,
        **dict.fromkeys(RESIDENT_ONLY),
    }


def _attachment(a: AttachmentInfo | None) -> dict[str, Any] | None:
    """The attachment as status shows it (never its id)."""
    if a is None:
        return None
    return {
        "state": a.state,
        "role": a.role,
        "label": a.label,
        "attached_at": iso(a.attached_at),
        "last_heartbeat_at": iso(a.last_heartbeat_at),
        "stale_since": iso(a.stale_since),
    }


def status_body(router: ModelRouter, placement: ModelPlacement | None) -> dict[str, Any]:
    """The spec's status table for `placement`'s barrier (every field null or idle when nothing is resident)."""
    w = placement.weights if placement is not None else None
    if w is None:
        return _idle_body()
    base = CatalogModel.objects.filter(name=w.base_name).first()
    return {
        "attached": w.attachment is not None,
        "attachment": _attachment(w.attachment),
        "barrier": w.barrier,
        "quiesced_at": iso(w.quiesced_at),
        "held_requests": w.held_requests,
        "weights_state": w.weights_state,
        "resident_model": {
            "model_id": base.pk if base else None,
            "name": w.base_name,
            "manifest_hash": w.manifest_hash,
        },
        "served_name": w.served_name,
        "origin": w.origin,
        "commits": w.commits,
        "steps_since_load": w.steps_since_load,
        "unsaved_commits": w.unsaved_commits,
        "last_save": with_iso_times(w.last_save),
        "commit": with_iso_times(w.commit),
        "commit_overran": iso(w.commit_overran),
        "last_hold_timeout_at": iso(w.last_hold_timeout_at),
        "last_overrun": with_iso_times(w.last_overrun),
        "pause_unavailable": None,
        "adapter": NO_ADAPTER,
        "cuda_memory": None,
        "exports_since_start": w.exports_since_start,
        "transition": w.transition,
        "attachable": w.attach_refusal is None,
        "not_attachable_reason": w.attach_refusal,
        "layout": w.layout,
        "forward_steps": w.forward_steps,
    }


def model_status(router: ModelRouter, placement: ModelPlacement | None) -> dict[str, Any]:
    """The status of one served model (None: the idle body), with `model`, the served name it answers for."""
    return {"model": placement.served_name if placement is not None else None, **status_body(router, placement)}


def status_overview(router: ModelRouter) -> dict[str, Any]:
    """GET status without a model: the default's status at the top level, and every served model's in `models`."""
    models = [model_status(router, placement) for placement in served_placements(router).values()]
    return {**model_status(router, default_placement(router)), "models": models}


def health_summary(router: ModelRouter | None) -> dict[str, Any]:
    """/api/health/detailed's weights block: the status route's names and values, for the default model."""
    placement = default_placement(router) if router is not None else None
    w = placement.weights if placement is not None else None
    if w is None:
        return {"weights_state": "clean", "barrier": "serving", "attached": False, "attachment_state": None}
    return {
        "weights_state": w.weights_state,
        "barrier": w.barrier,
        "attached": w.attachment is not None,
        "attachment_state": w.attachment.state if w.attachment else None,
    }
