"""The weights calls' write paths: which served model a call is for, the checks the control plane makes before the
worker's barrier makes its own, and what a save or a load records in the catalogue.

Only one attachment exists at a time, over every model served (spec: "One attachment at a time"), so the control
plane finds the attached model from the barriers' snapshots it keeps (`ModelPlacement.weights`) and refuses a second
attach, or a holder call with nothing attached, before any worker is asked. The worker's barrier checks the rest, in
the spec's order: the attachment id and label, then the state.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction

from inference.engine.contract import messages as p
from inference.engine.contract.checkpoint import MANIFEST_FILE, CheckpointCorrupt, inspect_checkpoint, read_manifest
from inference.engine.contract.weights import (
    LoadTarget,
    SaveRequest,
    ServedCheckpoint,
    WeightsCall,
    WeightsCode,
    WeightsOperation,
    WeightsSnapshot,
    answer_fields,
)
from inference.models import CatalogModel
from inference.runtime.engine_client import ModelPlacement
from inference.runtime.generation import EngineError
from inference.runtime.router import ModelRouter
from inference.services.catalogue import do_catalogue_model
from weights.errors import weights_error
from weights.model_choice import attached_placement, call_placement
from weights.models import Checkpoint

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
STEP_MAX = 2**31 - 1  # what Checkpoint.step holds
ROW_ID_MAX = 2**63 - 1  # what a database id holds
CHECKPOINT_REF_MAX = 1024  # Checkpoint.path's length; a name is shorter
# A quiesce waits for its drain, a save and a load for their files: the worker answers when they end.
SLOW_CALL_SLACK_S = 60.0

_attach_lock = asyncio.Lock()  # one attach decided at a time: two trainers racing get one attachment


@dataclass(slots=True)
class CallRecord:
    """What one call did, for its audit event: the model, the weights state before and after, and the numbers a
    commit-end reports."""

    model: str = ""
    state_before: str | None = None
    state_after: str | None = None
    attachment: str = ""  # the 8-character reference
    extra: dict[str, Any] = field(default_factory=dict)

    def saw(self, snapshot: WeightsSnapshot | None, *, before: bool = False) -> None:
        if snapshot is None:
            return
        self.model = snapshot.served_name
        if before:
            self.state_before = snapshot.weights_state
        self.state_after = snapshot.weights_state
        if snapshot.attachment is not None:
            self.attachment = snapshot.attachment.reference

    def audit_details(self, role: str) -> dict[str, Any]:
        """The audit event's details (never the attachment id: its 8-character reference)."""
        return {
            "role": role,
            "attachment": self.attachment or None,
            "weights_state_before": self.state_before,
            "weights_state": self.state_after,
            **self.extra,
        }


async def call_barrier(
    router: ModelRouter,
    operation: WeightsOperation,
    *,
    role: str,
    label: str,
    attachment_id: str | None = None,
    body: dict[str, Any] | None = None,
    model: str = "",
    record: CallRecord,
) -> dict[str, Any]:
    """One weights call for `model` ("": the default, weights/model_choice.py), checked here and then by the model's
    barrier; returns the route's `data`. Raises the ManagementError of a refusal."""
    body = dict(body or {})
    if operation is WeightsOperation.ATTACH:
        async with _attach_lock:
            placement = _attach_target(router, model)
            data = await _forward(router, placement, operation, role, label, attachment_id, None, record)
        data["model"]["model_id"] = await _catalogue_id(placement.weights.base_name)
        return data
    if operation is WeightsOperation.LOAD:
        placement = call_placement(router, model)
        _refuse_replicated(router, placement)
        target = await sync_to_async(_load_target)(body)
        data = await _forward(router, placement, operation, role, label, attachment_id, target, record)
        await sync_to_async(_record_served)(router, placement, target.path, target.origin)
        return data
    placement = _holder_placement(router, model)
    # only a save's fields travel: the other holder calls take none
    request = _save_request(body) if operation is WeightsOperation.SAVE else None
    data = await _forward(router, placement, operation, role, label, attachment_id, request, record)
    if operation is WeightsOperation.SAVE:
        await sync_to_async(_record_checkpoint)(data, placement, label)
        await sync_to_async(_record_served)(router, placement, data["path"], "checkpoint")
    if operation is WeightsOperation.COMMIT_END:
        record.extra = {"elapsed_ms": data["commit_ms"], "steps": data["steps_since_load"]}
    return data


def _holder_placement(router: ModelRouter, model: str) -> ModelPlacement:
    """The attached model, which a holder call (and clear-stale) is for; a `model` it names must be that one."""
    placement = attached_placement(router)
    if placement is None:
        raise weights_error(WeightsCode.NOT_ATTACHED, "nothing is attached")
    if model and model not in (placement.name, placement.weights.served_name):
        raise weights_error(
            WeightsCode.NOT_ATTACHED, f"nothing is attached to {model!r} ({placement.name!r} is attached)"
        )
    return placement


def _attach_target(router: ModelRouter, name: str) -> ModelPlacement:
    if (held := attached_placement(router)) is not None:
        info = held.weights.attachment
        raise weights_error(
            WeightsCode.ALREADY_ATTACHED,
            f"{info.role} {info.label!r} is attached ({info.state})",
            details={"role": info.role, "label": info.label, "state": info.state, "attached_at": info.attached_at},
        )
    placement = call_placement(router, name)
    if any(pl.state != "ready" for pl in router.placements().values()) or router.loads_in_progress():
        raise weights_error(WeightsCode.NOT_ATTACHABLE, "a load or an unload is in progress", reason="model_transition")
    _refuse_replicated(router, placement)
    return placement


def _refuse_replicated(router: ModelRouter, placement: ModelPlacement) -> None:
    """A model served by several replicas takes no attach and no weights load (400 NOT_ATTACHABLE, reason
    replicated, beside the spec's other reasons a model is not attachable): the trainer would write one replica's
    weights while the others answer with the old ones (docs/replicas.md). Unload the extra replicas by id first."""
    replicas = router.replicas(placement.served_name)
    if len(replicas) > 1:
        raise weights_error(
            WeightsCode.NOT_ATTACHABLE,
            f"{placement.served_name!r} is served by {len(replicas)} replicas; the weights of a replicated model "
            "cannot be attached to or loaded (unload the extra replicas by instance id first)",
            reason="replicated",
            details={"instance_ids": [pl.instance_id for pl in replicas]},
        )


async def _forward(
    router: ModelRouter,
    placement: ModelPlacement,
    operation: WeightsOperation,
    role: str,
    label: str,
    attachment_id: str | None,
    body: SaveRequest | LoadTarget | None,
    record: CallRecord,
) -> dict[str, Any]:
    record.saw(placement.weights, before=True)
    call = WeightsCall(operation=operation, role=role, label=label, attachment_id=attachment_id, body=body)
    timeout = settings.WEIGHTS_QUIESCE_DRAIN_TIMEOUT_S + SLOW_CALL_SLACK_S
    try:
        answer = await router.client.weights_call(placement.name, call, timeout=timeout)
    except EngineError as exc:
        code = WeightsCode.MODEL_NOT_LOADED if exc.reason == "model_not_loaded" else WeightsCode.INTERNAL
        raise weights_error(code, exc.message) from None
    record.saw(answer.snapshot)
    if isinstance(answer, p.WeightsRefused):
        raise weights_error(answer.code, answer.message, reason=answer.reason, details=answer.details)
    return answer_fields(answer.data)


def _save_request(body: dict[str, Any]) -> SaveRequest:
    run_id = body.get("run_id", "run")
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        raise weights_error(WeightsCode.INVALID_REQUEST, "run_id must be 1-100 letters, digits, '.', '_' or '-'")
    step = body.get("step")  # without one the barrier continues the lineage's numbering
    if "step" in body and (not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= STEP_MAX):
        raise weights_error(WeightsCode.INVALID_REQUEST, f"step must be an integer from 0 to {STEP_MAX}")
    return SaveRequest(run_id=run_id, root=str(settings.PANTHEON_CHECKPOINT_DIR), step=step)


def _load_target(body: dict[str, Any]) -> LoadTarget:
    """What POST /load writes in place: a checkpoint (by qualified name, id or directory; verified against its
    manifest before anything is touched) or a catalogue row (`model_id`). 400 INVALID_REQUEST for a field of the
    wrong type, 404 CHECKPOINT_NOT_FOUND for one that names nothing."""
    if "model_id" in body:
        row_id = body["model_id"]
        if not isinstance(row_id, int) or isinstance(row_id, bool):
            raise weights_error(WeightsCode.INVALID_REQUEST, "model_id must be an integer: a catalogue row's id")
        row = CatalogModel.objects.filter(pk=row_id).first() if 0 < row_id <= ROW_ID_MAX else None
        if row is None:
            raise weights_error(WeightsCode.CHECKPOINT_NOT_FOUND, f"no catalogue row has id {row_id}")
        saved = Checkpoint.objects.filter(catalog=row).first()
        if saved is not None:
            return _checkpoint_target(saved)
        return LoadTarget(path=row.path, served_name=row.name, origin="model")
    wanted = body.get("checkpoint")
    if not isinstance(wanted, str | int) or isinstance(wanted, bool) or wanted == "":
        raise weights_error(
            WeightsCode.INVALID_REQUEST, "give `checkpoint` (a qualified name, id or path) or `model_id`"
        )
    if isinstance(wanted, str) and ("\0" in wanted or len(wanted) > CHECKPOINT_REF_MAX):
        message = f"`checkpoint` must be a name or a path: at most {CHECKPOINT_REF_MAX} characters, no NUL"
        raise weights_error(WeightsCode.INVALID_REQUEST, message)
    saved = Checkpoint.objects.filter(name=wanted).first() if isinstance(wanted, str) else None
    if saved is None and (isinstance(wanted, int) or wanted.isdecimal()) and 0 < int(wanted) <= ROW_ID_MAX:
        saved = Checkpoint.objects.filter(pk=int(wanted)).first()
    if saved is None and isinstance(wanted, str) and (directory := _checkpoint_dir(wanted)) is not None:
        saved = Checkpoint.objects.filter(path=str(directory)).first()
        if saved is None:
            return _manifest_target(directory)
    if saved is None:
        raise weights_error(WeightsCode.CHECKPOINT_NOT_FOUND, f"no checkpoint {wanted!r}")
    return _checkpoint_target(saved)


def _checkpoint_dir(wanted: str) -> Path | None:
    """`wanted` as a checkpoint directory (one with a manifest), or None; a path the system cannot even look at
    (a name too long) is none."""
    try:
        return Path(wanted).resolve() if (Path(wanted) / MANIFEST_FILE).is_file() else None
    except OSError:
        return None


def _checkpoint_target(saved: Checkpoint) -> LoadTarget:
    return LoadTarget(
        path=saved.path,
        served_name=saved.name,
        origin="checkpoint",
        manifest_hash=saved.weights_sha256,
        parent=saved.parent.name if saved.parent else None,
        step=saved.step,
        verify=True,
    )


def _manifest_target(directory: Path) -> LoadTarget:
    """A checkpoint directory no row records (copied from elsewhere): what its manifest says."""
    try:
        manifest = read_manifest(directory)
    except CheckpointCorrupt as exc:
        raise weights_error(WeightsCode.CHECKPOINT_CORRUPT, str(exc)) from None
    checkpoint = ServedCheckpoint.from_manifest(manifest)
    return LoadTarget(
        path=str(directory),
        served_name=checkpoint.name or directory.name,
        origin="checkpoint",
        step=checkpoint.step,
        verify=True,
    )


def _record_served(router: ModelRouter, placement: ModelPlacement, path: str, origin: str) -> None:
    """What the placement serves since a save or a weights load, kept where a restart and a crash reload find it:
    the catalogue row of its served name (the checkpoint directory; none when the row's own weights, or another
    model's, were loaded) and the placement's load."""
    checkpoint = path if origin == "checkpoint" else ""
    CatalogModel.objects.filter(name=placement.served_name).update(served_checkpoint=checkpoint)
    served = ServedCheckpoint.from_manifest(read_manifest(checkpoint)) if checkpoint else None
    router.client.serve_weights_from(placement.name, path, served)


def _record_checkpoint(manifest: dict[str, Any], placement: ModelPlacement, label: str) -> None:
    """The saved step as a Checkpoint row and a catalogue row under its qualified name (not autoloaded)."""
    info = inspect_checkpoint(manifest["path"])
    base = CatalogModel.objects.filter(name=manifest["base_model"]).first()
    options = base.load_options if base is not None else placement.load.options
    with transaction.atomic():
        catalog = do_catalogue_model(manifest["name"], info, options, architecture=info.architecture)
        CatalogModel.objects.filter(pk=catalog.pk).update(autoload=False)
        Checkpoint.objects.create(
            name=manifest["name"],
            run_id=manifest["run_id"],
            step=manifest["step"],
            parent=Checkpoint.objects.filter(name=manifest["parent"]).first() if manifest.get("parent") else None,
            base_model=manifest["base_model"],
            weights_sha256=manifest["weights_sha256"],
            path=manifest["path"],
            saved_by=label,
            catalog=catalog,
        )


async def _catalogue_id(name: str) -> int | None:
    row = await CatalogModel.objects.filter(name=name).afirst()
    return None if row is None else row.pk


def lineage(served: WeightsSnapshot) -> list[dict[str, Any]]:
    """The parent chain of the served weights: the served set itself, each checkpoint it descends from, the base."""
    chain: list[dict[str, Any]] = [
        {
            "kind": "served",
            "name": served.served_name,
            "origin": served.origin,
            "commits": served.commits,
            "unsaved_commits": served.unsaved_commits,
        }
    ]
    saved = Checkpoint.objects.filter(name=served.served_name).first() if served.origin == "checkpoint" else None
    seen = set()
    while saved is not None and saved.pk not in seen:
        seen.add(saved.pk)
        chain.append({"kind": "checkpoint", **checkpoint_row(saved)})
        saved = saved.parent
    base = CatalogModel.objects.filter(name=served.base_name).first()
    chain.append(
        {
            "kind": "model",
            "name": served.base_name,
            "model_id": base.pk if base else None,
            "path": base.path if base else None,
        }
    )
    return chain


def checkpoint_row(saved: Checkpoint) -> dict[str, Any]:
    return {
        "id": saved.pk,
        "name": saved.name,
        "parent": saved.parent.name if saved.parent_id else None,
        "base_model": saved.base_model,
        "run_id": saved.run_id,
        "step": saved.step,
        "sha256": saved.weights_sha256,
        "path": saved.path,
        "created": saved.created_at.isoformat(),
        "saved_by": saved.saved_by,
    }
