"""Loading and unloading models in the running server: the engine call, the catalogue and instance rows, the
instance id on the served model's placement. The operator routes, the on-demand load of /v1 and `serve`'s autoload
all come here.

A load is checked before anything changes (path, device, name, memory admission), then run on the worker, and only
a load that succeeded is written: one transaction updates the catalogue row (when the load is an operator's) and
creates the instance row. A refused or failed load therefore leaves the catalogue and the instances as they were.
Loading a name that is already served adds a replica of it (spec: duplicate names are allowed), and `dies` with
several ordinals loads one replica on each; each replica is a placement of its own, keyed `name`, `name#2`, ...,
with an instance row of its own (docs/replicas.md).
An unload drains the model's generations first, for up to PANTHEON_UNLOAD_DRAIN_TIMEOUT_S; generations still
running then are ended with an error, and the unload completes. The worker's part of each load and unload that
succeeded is timed into pantheon_model_load_seconds / pantheon_model_unload_seconds (a reload after a worker crash is
the supervisor's, not timed there).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
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
from inference.runtime.client_protocol import ModelPlacement
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
    """Loads `request` and returns its /admin/models row: one replica per die named, else one replica on its
    device; a name already served gets another replica (of the same checkpoint: 409 replica_differs otherwise).
    With several dies the row is the first replica's, and `replicas` holds every new replica's row; when one of them
    fails, those this call loaded are unloaded again. `operator`: the load is an operator's, so its path and options
    become the catalogue's defaults for that name and `serve` loads it again at start; a load from the catalogue (on
    demand, at start) leaves the row as it is. Raises LoadFailed (400, 404, 409, 507, 500)."""
    check_weights_allow_load(router)
    info = await asyncio.to_thread(checkpoint_at, request.path)
    name = request.name or info.default_name
    for placement in router.replicas(name):
        if placement.load.path != str(info.path):
            raise LoadFailed(
                f"model {name!r} is served from {placement.load.path}; a replica must load the same checkpoint, not "
                f"{info.path}",
                status=409,
                reason="replica_differs",
            )
    devices = _resolve_devices(router, request)
    options = await sync_to_async(catalogued_options)(name, request.options)
    return await router.run_load(name, lambda: _load_replicas(router, request, info, name, devices, options, operator))


async def _load_replicas(
    router: ModelRouter,
    request: LoadRequest,
    info: Checkpoint,
    name: str,
    devices: list[str],
    options: LoadOptions,
    operator: bool,
) -> dict[str, Any]:
    """One replica per device, one after another (each admitted against its device's memory as it is then)."""
    rows: list[dict[str, Any]] = []
    try:
        for device in devices:
            rows.append(await _load(router, request, info, name, device, options, operator))
    except BaseException:
        for row in rows:  # all or none: the replicas this call loaded go again
            with contextlib.suppress(Exception):
                await router.client.unload(row["placement"], drain_timeout=0)
                await sync_to_async(_record_unload)(name, row["instance_id"], True)
        raise
    return rows[0] if len(rows) == 1 else {**rows[0], "replicas": rows}


def replica_key(router: ModelRouter, name: str) -> str:
    """The key of a new replica of `name`: the name itself for the first, else `name#2`, `name#3`, ... (the first
    free one). Never shown to clients as a model id."""
    taken = router.placements()
    if name not in taken:
        return name
    return next(key for n in itertools.count(2) if (key := f"{name}#{n}") not in taken)


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
    router: ModelRouter,
    request: LoadRequest,
    info: Checkpoint,
    name: str,
    device: str,
    options: LoadOptions,
    operator: bool,
) -> dict[str, Any]:
    """One replica's load, as part of the one load of `name` in progress: admit, load on the worker, record."""
    client = router.client
    key = replica_key(router, name)
    await _admit(router, device, info)
    trainer_tokens = AccessToken.objects.filter(role=Role.TRAINER, revoked_at__isnull=True)
    limits = serving_limits(options, attachable=await trainer_tokens.aexists())
    started = time.monotonic()
    try:
        loaded = await client.load(
            key,
            info.path,
            options=options,
            limits=limits,
            device=device,
            timeout=settings.PANTHEON_LOAD_TIMEOUT_S,
            checkpoint=request.checkpoint,
            served_name=name,
        )
    except EngineError as exc:
        raise as_api_error(exc, failed=LoadFailed) from exc
    except TimeoutError:
        raise LoadFailed(
            f"loading {name!r} took longer than {settings.PANTHEON_LOAD_TIMEOUT_S:g} s", reason="load_timeout"
        ) from None
    MODEL_LOAD.labels(name).observe(time.monotonic() - started)
    try:
        instance_id = await sync_to_async(_record_load)(
            name, info, request, options, loaded, limits, operator, router.server
        )
    except Exception as exc:
        # Not recorded, not served: a load the database does not hold would be one the catalogue, the instances
        # and the audit log never saw. A database that cannot be reached is the client's 503 (logged once where it
        # is answered); anything else is a bug, logged with its traceback.
        unavailable = database_unavailable(exc)
        if unavailable is None:
            logger.exception("recording the load of %s failed; unloading it again", key)
        await client.unload(key, drain_timeout=0)
        if unavailable is not None:
            raise unavailable from exc
        raise LoadFailed(f"the load of {name!r} could not be recorded: {exc}", reason="record_failed") from exc
    placement = router.record_instance(key, instance_id)
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


def _resolve_devices(router: ModelRouter, request: LoadRequest) -> list[str]:
    """Where each replica goes: one per die of `dies` (CUDA ordinals, spec), else `device`, else a GPU worker with the
    fewest models, else cpu. Refuses dies on a host without any, a die named twice, a die not visible, a device
    without a worker (400 load_failed)."""
    if not request.dies:
        return [_resolve_device(router, request.device)]
    visible = dies_visible(router.client)
    if visible == 0:
        raise LoadFailed(
            "dies were named but this server sees no CUDA device; omit dies to load on the CPU",
            status=400,
            reason="no_dies",
        )
    if len(set(request.dies)) < len(request.dies):
        raise LoadFailed("a die is named twice; name each die once", status=400, reason="die_repeated")
    for die in request.dies:
        if die >= visible:
            raise LoadFailed(
                f"die {die} is not visible (this server sees dies 0..{visible - 1})",
                status=400,
                reason="die_not_visible",
            )
    return [_resolve_device(router, f"cuda:{die}") for die in request.dies]


def _resolve_device(router: ModelRouter, device: str) -> str:
    workers = router.client.workers()
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
    server: str,
) -> int:
    with transaction.atomic():
        if operator:
            device = loaded.device if request.device or request.dies else ""
            catalog = do_catalogue_model(name, info, options, device=device, architecture=loaded.architecture)
        else:
            catalog = CatalogModel.objects.get(name=name)
        ModelInstance.objects.filter(served_name=name, server=server, state=InstanceState.FAILED).delete()
        instance = ModelInstance.objects.create(
            catalog=catalog,
            served_name=name,
            server=server,
            worker=Worker.objects.filter(server=server, device=loaded.device).first(),
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
    """Unloads a model by served name (every replica of it) or one replica by instance id, draining their
    generations first. Raises UnloadFailed (404 not loaded, 409 already unloading or still loading, 500); replicas
    unloaded before one refused stay unloaded."""
    if instance_id is not None:
        placement = router.by_instance_id(instance_id)
        if placement is None or (name and placement.served_name != name):
            raise UnloadFailed(f"no loaded instance has id {instance_id}", status=404, reason="unknown_instance")
        name, placements = placement.served_name, [placement]
    else:
        placements = router.replicas(name)
        if not placements:
            raise UnloadFailed(f"model {name!r} is not loaded", status=404, reason="not_loaded")
        if router.is_loading(name):  # a replica on its way would outlive the unload of the others
            raise UnloadFailed(f"model {name!r} is loading", status=409, reason="loading")
    for placement in placements:
        if placement.state in ("loading", "unloading"):
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
    replies = [await _unload_one(router, placement) for placement in placements]
    result: dict[str, Any] = {"unloaded": name}
    ids = [placement.instance_id for placement in placements if placement.instance_id is not None]
    if len(ids) == 1:
        result["instance_id"] = ids[0]
    elif ids:
        result["instance_ids"] = ids
    result["aborted"] = sum(reply.aborted for reply in replies)
    return result


async def _unload_one(router: ModelRouter, placement: ModelPlacement) -> p.Unloaded:
    """One replica's unload: its row says unloading, the worker drains and frees it, the row goes."""
    await sync_to_async(_set_instance_state)(placement.instance_id, InstanceState.UNLOADING)
    started = time.monotonic()
    try:
        reply = await router.client.unload(placement.name, drain_timeout=settings.PANTHEON_UNLOAD_DRAIN_TIMEOUT_S)
    except EngineError as exc:
        await sync_to_async(_set_instance_state)(placement.instance_id, InstanceState.READY)
        raise as_api_error(exc, failed=UnloadFailed) from exc
    MODEL_UNLOAD.labels(placement.served_name).observe(time.monotonic() - started)
    still_served = any(pl is not placement for pl in router.replicas(placement.served_name))
    await sync_to_async(_record_unload)(placement.served_name, placement.instance_id, still_served)
    return reply


def _set_instance_state(instance_id: int | None, state: str, *, last_error: str = "") -> None:
    if instance_id is not None:
        fields = {"state": state}
        if last_error:
            fields["last_error"] = last_error
        ModelInstance.objects.filter(pk=instance_id).update(**fields)


def _record_unload(name: str, instance_id: int | None, still_served: bool = False) -> None:
    """The instance is gone, and once no replica of the model is left the catalogue no longer asks `serve` to load
    it at start."""
    with transaction.atomic():
        if instance_id is not None:
            ModelInstance.objects.filter(pk=instance_id).delete()
        if not still_served:
            CatalogModel.objects.filter(name=name).update(autoload=False)
