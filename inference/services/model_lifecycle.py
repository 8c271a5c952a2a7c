"""Loading and unloading models in the running server: the engine call, the catalogue and instance rows, the
instance id on the served model's placement. The operator routes, the on-demand load of /v1 and `serve`'s autoload
all come here.

A load is checked before anything changes (path, device, name, memory admission), then run on the worker, and only
a load that succeeded is written: one transaction updates the catalogue row (when the load is an operator's) and
creates the instance row. A refused or failed load therefore leaves the catalogue and the instances as they were.
An unload drains the model's generations first, for up to PANTHEON_UNLOAD_DRAIN_TIMEOUT_S; generations still
running then are ended with an error, and the unload completes. The worker's part of each load and unload that
succeeded is timed into pantheon_model_load_seconds / pantheon_model_unload_seconds (a reload after a worker crash is
the supervisor's, not timed there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.engine.contract import messages as p
from inference.engine.contract.checkpoint import Checkpoint, CheckpointCorrupt, read_manifest
from inference.engine.contract.metrics import MODEL_LOAD, MODEL_UNLOAD
from inference.engine.contract.params import LoadOptions, ServingLimits
from inference.engine.contract.weights import ServedCheckpoint, WeightsTimers
from inference.models import CatalogModel, InstanceState, ModelInstance, Worker
from inference.runtime.generation import EngineError
from inference.runtime.host_probe import dies_visible
from inference.runtime.router import ModelRouter
from inference.services.catalogue import catalogued_options, checkpoint_at, do_catalogue_model
from inference.services.model_rows import admin_model_row
from inference.services.refusals import as_api_error
from pantheon_site.audit import AuditedCall
from pantheon_site.errors import LoadFailed, ModelNotFound, UnloadFailed, WeightsTorn, database_unavailable
from pantheon_site.models import AccessToken, Role

logger = logging.getLogger("pantheon.models")


@dataclass(slots=True)
class LoadRequest:
    """What to load: a checkpoint path, the served name (default: the file or directory name), where, and how;
    `checkpoint` when the path is the trainer checkpoint a catalogue row serves (its weights answer as it).
    `options` are the LoadOptions fields the caller named; the others keep the catalogue entry's saved values
    (`catalogued_options`)."""

    path: str
    name: str = ""
    device: str = ""  # "" : a GPU worker with the fewest models, else cpu
    dies: list[int] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    checkpoint: ServedCheckpoint | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> LoadRequest:
        """From LoadModelSerializer's validated data, which holds the LoadOptions fields the body named."""
        options = {name: body[name] for name in LoadOptions.__struct_fields__ if name in body}
        return cls(body["path"], body.get("name", ""), body.get("device", ""), list(body.get("dies") or []), options)

    @classmethod
    def from_catalog(cls, model: CatalogModel) -> LoadRequest:
        """The row's load: of the checkpoint it serves when it records one (LoadFailed when that one is gone: the
        base weights are not served in its place without a word), else of its own path."""
        options = msgspec.structs.asdict(model.load_options)
        if not model.served_checkpoint:
            return cls(model.path, model.name, model.device, [], options)
        try:
            checkpoint = ServedCheckpoint.from_manifest(read_manifest(model.served_checkpoint))
        except CheckpointCorrupt as exc:
            raise LoadFailed(
                f"{model.name!r} serves the checkpoint {model.served_checkpoint}, which cannot be read ({exc}); load "
                "the weights it should serve with POST /admin/models/load",
                status=404,
                reason="checkpoint_not_found",
            ) from None
        return cls(model.served_checkpoint, model.name, model.device, [], options, checkpoint)


async def do_load_model(router: ModelRouter, request: LoadRequest, *, operator: bool = True) -> dict[str, Any]:
    """Loads `request` and returns its /admin/models row. `operator`: the load is an operator's, so its path and
    options become the catalogue's defaults for that name and `serve` loads it again at start; a load from the
    catalogue (on demand, at start) leaves the row as it is. Raises LoadFailed (400, 404, 409, 507, 500)."""
    check_weights_allow_load(router)
    info = await asyncio.to_thread(checkpoint_at, request.path)
    name = request.name or info.default_name
    placement = router.placements().get(name)
    if placement is not None:
        state = "loaded" if placement.state == "ready" else placement.state
        raise LoadFailed(f"model {name!r} is already {state}", status=409, reason="already_loaded")
    options = await sync_to_async(catalogued_options)(name, request.options)
    return await router.run_load(name, lambda: _load(router, request, info, name, options, operator))


async def load_catalogued(router: ModelRouter, name: str, trigger: str) -> dict[str, Any]:
    """Loads a catalogued model as the system's own audited `model_load` (actor_label: the trigger, "autoload" or
    "on_demand"): the load the control plane starts itself, at start and for a /v1 request naming the model."""
    async with AuditedCall("model_load", model=name, actor_kind="system", actor_label=trigger) as call:
        try:
            model = await CatalogModel.objects.aget(name=name)
        except CatalogModel.DoesNotExist:
            raise ModelNotFound(f"model {name!r} is not in the catalogue", reason="not_catalogued") from None
        row = await do_load_model(router, LoadRequest.from_catalog(model), operator=False)
        call.details = {"trigger": trigger, "device": row["device"], "instance_id": row.get("instance_id")}
    return row


async def _load(
    router: ModelRouter, request: LoadRequest, info: Checkpoint, name: str, options: LoadOptions, operator: bool
) -> dict[str, Any]:
    """The load itself, as the one load of `name` in progress: place, admit, load on the worker, record."""
    client = router.client
    device = _resolve_device(router, request)
    await _admit(router, device, info)
    trainer_tokens = AccessToken.objects.filter(role=Role.TRAINER, revoked_at__isnull=True)
    limits = serving_limits(options, attachable=await trainer_tokens.aexists())
    started = time.monotonic()
    try:
        loaded = await client.load(
            name,
            info.path,
            options=options,
            limits=limits,
            device=device,
            timeout=settings.PANTHEON_LOAD_TIMEOUT_S,
            checkpoint=request.checkpoint,
        )
    except EngineError as exc:
        raise as_api_error(exc, failed=LoadFailed) from exc
    except TimeoutError:
        raise LoadFailed(
            f"loading {name!r} took longer than {settings.PANTHEON_LOAD_TIMEOUT_S:g} s", reason="load_timeout"
        ) from None
    MODEL_LOAD.labels(name).observe(time.monotonic() - started)
    try:
        instance_id = await sync_to_async(_record_load)(name, info, request, options, loaded, limits, operator)
    except Exception as exc:
        # Not recorded, not served: a load the database does not hold would be one the catalogue, the instances
        # and the audit log never saw. A database that cannot be reached is the client's 503 (logged once where it
        # is answered); anything else is a bug, logged with its traceback.
        unavailable = database_unavailable(exc)
        if unavailable is None:
            logger.exception("recording the load of %s failed; unloading it again", name)
        await client.unload(name, drain_timeout=0)
        if unavailable is not None:
            raise unavailable from exc
        raise LoadFailed(f"the load of {name!r} could not be recorded: {exc}", reason="record_failed") from exc
    placement = router.record_instance(name, instance_id)
    router.catalog_names = router.catalog_names | {name}
    if placement is None:  # its worker crashed and the reload failed while the row was written
        message = "the reload after a worker crash failed"
        await sync_to_async(_set_instance_state)(instance_id, InstanceState.FAILED, last_error=message)
        raise LoadFailed(f"{name!r} is no longer served: {message}", reason="reload_failed")
    return admin_model_row(placement)


def check_weights_allow_load(router: ModelRouter) -> None:
    """Refuses a load while a trainer is attached (409 already_attached, stale or not: the load would pull the
    weights from under it) or while a model's weights are torn (503 weights_torn: restore them first)."""
    for placement in router.placements().values():
        weights = placement.weights
        if weights is not None and weights.attachment is not None:
            raise LoadFailed(
                f"ALREADY_ATTACHED: {weights.attachment.role} {weights.attachment.label!r} is attached "
                f"to {weights.served_name!r}; detach first",
                status=409,
                reason="already_attached",
            )
        if weights is not None and weights.weights_state == "torn":
            raise WeightsTorn(
                f"the weights of {weights.served_name!r} are torn; restore them with "
                "POST /api/weights/load before loading another model",
                reason="weights_torn",
                retry_after=settings.WEIGHTS_HOLD_TIMEOUT_S,
            )


def serving_limits(options: LoadOptions, *, attachable: bool = False) -> ServingLimits:
    """What the worker serves a load within, from the operator's options and the settings: `max_concurrent` is the
    load's own, else its max_sessions, else PANTHEON_BATCH_SLOTS; `batch_slots` is PANTHEON_BATCH_SLOT_SHARE of it,
    rounded down, at least one; `max_sessions` is the load's own, else
    max_concurrent, and 0 (no sessions) when PANTHEON_SESSIONS is off. `attachable` (a trainer token exists) loads
    the weights where a trainer can attach to them, under the WEIGHTS_* timers."""
    max_concurrent = options.max_concurrent or options.max_sessions or settings.PANTHEON_BATCH_SLOTS
    return ServingLimits(
        max_concurrent=max_concurrent,
        batch_slots=max(1, int(max_concurrent * settings.PANTHEON_BATCH_SLOT_SHARE)),
        queue_depth=settings.PANTHEON_QUEUE_DEPTH,
        queue_timeout=settings.PANTHEON_QUEUE_WAIT_S,
        prefill_chunk=settings.PANTHEON_PREFILL_CHUNK,
        min_free_memory=settings.PANTHEON_MIN_FREE_MEMORY_BYTES,
        block_size=settings.PANTHEON_KV_BLOCK_SIZE,
        prefix_cache_bytes=settings.PANTHEON_PREFIX_CACHE_BYTES,
        max_sessions=(options.max_sessions or max_concurrent) if settings.PANTHEON_SESSIONS else 0,
        session_idle_ttl=settings.PANTHEON_SESSION_IDLE_TTL_S,
        watch_grace=settings.PANTHEON_SESSION_WATCH_GRACE_S,
        repetition_span=settings.PANTHEON_REPETITION_LOOP_TOKENS,
        attachable=attachable,
        weights_timers=WeightsTimers(
            hold_timeout_s=settings.WEIGHTS_HOLD_TIMEOUT_S,
            commit_watchdog_ms=settings.WEIGHTS_COMMIT_WATCHDOG_MS,
            heartbeat_timeout_s=settings.WEIGHTS_HEARTBEAT_TIMEOUT_S,
            quiesce_drain_timeout_s=settings.WEIGHTS_QUIESCE_DRAIN_TIMEOUT_S,
            heartbeat_interval_hint_s=settings.WEIGHTS_HEARTBEAT_INTERVAL_HINT_S,
        ),
    )


def _resolve_device(router: ModelRouter, request: LoadRequest) -> str:
    """`dies` (CUDA ordinals, spec) or `device`; refuses dies on a host without any (400 load_failed)."""
    workers = router.client.workers()
    device = request.device
    if request.dies:
        visible = dies_visible(router.client)
        if visible == 0:
            raise LoadFailed(
                "dies were named but this server sees no CUDA device; omit dies to load on the CPU",
                status=400,
                reason="no_dies",
            )
        if len(request.dies) > 1:
            raise LoadFailed("a model is placed on one die; name a single die", status=400, reason="multi_die")
        if request.dies[0] >= visible:
            raise LoadFailed(
                f"die {request.dies[0]} is not visible (this server sees dies 0..{visible - 1})",
                status=400,
                reason="die_not_visible",
            )
        device = f"cuda:{request.dies[0]}"
    if not device:
        counts = {d: 0 for d in workers if d.startswith("cuda")}
        for placement in router.placements().values():
            if placement.device in counts:
                counts[placement.device] += 1
        device = min(counts, key=counts.get) if counts else "cpu"
    if device not in workers:
        raise LoadFailed(f"no worker runs on device {device!r}", status=400, reason="no_worker")
    return device


async def _admit(router: ModelRouter, device: str, info: Checkpoint) -> None:
    """Refuses (507) a checkpoint larger on disk than the device's free memory: it cannot fit once loaded."""
    statuses = await router.client.status()
    status = next((s for s in statuses if s.device == device), None)
    if status is None:
        return
    free = status.memory_total - status.memory_used
    if info.size_bytes > free:
        raise LoadFailed(
            f"admission refused: the weights take {info.size_bytes} bytes and {device} has {free} free",
            status=507,
            reason="admission",
        )


def _record_load(
    name: str,
    info: Checkpoint,
    request: LoadRequest,
    options: LoadOptions,
    loaded: p.Loaded,
    limits: ServingLimits,
    operator: bool,
) -> int:
    with transaction.atomic():
        if operator:
            device = loaded.device if request.device or request.dies else ""
            catalog = do_catalogue_model(name, info, options, device=device, architecture=loaded.architecture)
        else:
            catalog = CatalogModel.objects.get(name=name)
        ModelInstance.objects.filter(served_name=name, state=InstanceState.FAILED).delete()
        instance = ModelInstance.objects.create(
            catalog=catalog,
            served_name=name,
            worker=Worker.objects.filter(device=loaded.device).first(),
            device=loaded.device,
            state=InstanceState.READY,
            load_options=options,
            memory_bytes=loaded.weight_bytes + loaded.kv_bytes + loaded.prefix_cache_bytes,
            max_sessions=limits.max_sessions,
            max_concurrent=loaded.max_concurrent,
            max_concurrent_configured=limits.max_concurrent,
            context_window=loaded.context_window,
            context_window_configured=loaded.context_window_configured or options.ctx_cap or loaded.context_window,
            loaded_at=timezone.now(),
        )
    return instance.pk


async def do_unload_model(router: ModelRouter, *, name: str = "", instance_id: int | None = None) -> dict[str, Any]:
    """Unloads a model by served name or instance id, draining its generations first. Raises UnloadFailed
    (404 not loaded, 409 already unloading or still loading, 500)."""
    if instance_id is not None:
        placement = router.by_instance_id(instance_id)
        if placement is None or (name and placement.name != name):
            raise UnloadFailed(f"no loaded instance has id {instance_id}", status=404, reason="unknown_instance")
        name = placement.name
    else:
        placement = router.placements().get(name)
        if placement is None:
            raise UnloadFailed(f"model {name!r} is not loaded", status=404, reason="not_loaded")
    if placement.state in ("loading", "unloading") or router.is_loading(name):
        raise UnloadFailed(f"model {name!r} is {placement.state}", status=409, reason=placement.state)
    if (
        held := next((pl.weights for pl in router.placements().values() if pl.weights and pl.weights.attachment), None)
    ) is not None:
        raise UnloadFailed(
            f"ALREADY_ATTACHED: {held.attachment.role} {held.attachment.label!r} is attached to "
            f"{held.served_name!r}; detach first",
            status=409,
            reason="already_attached",
        )
    await sync_to_async(_set_instance_state)(placement.instance_id, InstanceState.UNLOADING)
    started = time.monotonic()
    try:
        reply = await router.client.unload(name, drain_timeout=settings.PANTHEON_UNLOAD_DRAIN_TIMEOUT_S)
    except EngineError as exc:
        await sync_to_async(_set_instance_state)(placement.instance_id, InstanceState.READY)
        raise as_api_error(exc, failed=UnloadFailed) from exc
    MODEL_UNLOAD.labels(name).observe(time.monotonic() - started)
    await sync_to_async(_record_unload)(name, placement.instance_id)
    result: dict[str, Any] = {"unloaded": name}
    if placement.instance_id is not None:
        result["instance_id"] = placement.instance_id
    result["aborted"] = reply.aborted
    return result


def _set_instance_state(instance_id: int | None, state: str, *, last_error: str = "") -> None:
    if instance_id is not None:
        fields = {"state": state}
        if last_error:
            fields["last_error"] = last_error
        ModelInstance.objects.filter(pk=instance_id).update(**fields)


def _record_unload(name: str, instance_id: int | None) -> None:
    """The instance is gone, and the catalogue no longer asks `serve` to load the model at start."""
    with transaction.atomic():
        if instance_id is not None:
            ModelInstance.objects.filter(pk=instance_id).delete()
        CatalogModel.objects.filter(name=name).update(autoload=False)
