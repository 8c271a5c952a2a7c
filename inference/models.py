"""The serving control plane's records: the model catalogue, the worker processes, and what each worker holds.

The database is the durable mirror of serving state — what to load at start, what a restarted worker must get back,
what operators see. The request hot path never reads it: routing uses the supervisor's in-memory registry.
"""

import msgspec
from django.core.exceptions import ValidationError
from django.db import models

from inference.engine.contract.params import LoadOptions


class LoadOptionsField(models.JSONField):
    """A load's options as one JSON object, read and written as the contract's LoadOptions: a value is validated by
    the struct on the way in (ValidationError naming the field) and comes back a LoadOptions, so the rows, the
    route, the command and the worker share one schema. A row written before an option existed gets its default.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("default", LoadOptions)
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") is LoadOptions:
            del kwargs["default"]
        return name, path, args, kwargs

    def to_python(self, value):
        if value is None or isinstance(value, LoadOptions):
            return value
        try:
            return msgspec.convert(value, LoadOptions)
        except msgspec.ValidationError as exc:
            raise ValidationError(f"invalid load options: {exc}", code="invalid") from None

    def from_db_value(self, value, expression, connection):
        value = super().from_db_value(value, expression, connection)
        return self.to_python(value) if isinstance(value, dict) else value  # a key lookup's value stays as it is

    def get_prep_value(self, value):
        if isinstance(value, LoadOptions | dict):
            value = msgspec.to_builtins(self.to_python(value))
        return super().get_prep_value(value)

    def validate(self, value, model_instance):
        super().validate(self.get_prep_value(value), model_instance)

    def value_to_string(self, obj):
        return self.get_prep_value(self.value_from_object(obj))


class ModelFormat(models.TextChoices):
    """How the weights are stored on disk."""

    HF = "hf", "Hugging Face directory"
    GGUF = "gguf", "GGUF file"


class CatalogModel(models.Model):
    """A model Pantheon knows how to load: where its weights are, and the options a load uses unless told otherwise.

    `name` is the served id clients route on. `load_options` are the options a load of it uses (LoadOptions: the
    spec's load route's fields, 0 meaning the engine's default). An empty device means automatic (the first free
    one). `autoload` rows are loaded by `serve` at start. `served_checkpoint` is the trainer checkpoint directory
    whose weights the model serves since a save or a POST /api/weights/load (empty: its own `path`): every load of
    the row (at start, on demand) loads that one, under the checkpoint's qualified name.
    """

    name = models.CharField(max_length=200, unique=True)
    path = models.CharField(max_length=1024)
    format = models.CharField(max_length=8, choices=ModelFormat.choices)
    architecture = models.CharField(max_length=64, blank=True)
    size_bytes = models.BigIntegerField(default=0, help_text="bytes of the weight files on disk")
    load_options = LoadOptionsField()
    device = models.CharField(max_length=32, blank=True)
    autoload = models.BooleanField(default=True)
    served_checkpoint = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class WorkerState(models.TextChoices):
    """A worker's life: starting until it reports ready; dead when it exited unasked; stopped on shutdown."""

    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"
    STOPPED = "stopped"


class Worker(models.Model):
    """The long-lived engine process for one device (`cpu` or `cuda:N`) of one `serve`, as its supervisor last saw it.

    One row per serve and device, reused across restarts: `restarts` counts how often the supervisor brought it back.
    `server` names the serve (its host:port), so several serve processes can share one database (docs/fleet.md).
    `endpoint` is the ZMQ address the control plane talks to it on. A running serve rewrites the row at least every
    HEARTBEAT_RECORD_S (inference/runtime/control_plane.py), so `updated_at` says when one last vouched for it: a row
    `starting` or `ready` that none did for PANTHEON_WORKER_STALE_AFTER_S is marked dead by the periodic work
    (inference/services/stale_workers.py).
    """

    server = models.CharField(max_length=255, blank=True, default="")
    device = models.CharField(max_length=32)
    pid = models.IntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.STARTING)
    restarts = models.PositiveIntegerField(default=0)
    endpoint = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["server", "device"]
        constraints = [models.UniqueConstraint(fields=["server", "device"], name="one_worker_row_per_serve_device")]

    def __str__(self) -> str:
        return f"worker {self.device} ({self.state})"


class InstanceState(models.TextChoices):
    """An instance's life: loading, ready (serving), unloading (draining), or failed (see last_error)."""

    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


class ModelInstance(models.Model):
    """One loaded (or loading, unloading, failed) copy of a catalogue model on one worker.

    Several instances may share a served name (replicas on different devices); the id tells them apart, and unload
    accepts either. `load_options` are the options the worker was given, so a restarted worker gets the same load.
    The *_configured fields are what was asked for; max_concurrent and context_window are what the engine serves
    (they can be lower), exactly the pairs /admin/models reports.
    """

    catalog = models.ForeignKey(CatalogModel, on_delete=models.PROTECT, related_name="instances")
    served_name = models.CharField(max_length=200, db_index=True)
    server = models.CharField(max_length=255, blank=True, default="")  # the serve holding it (Worker.server)
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.SET_NULL, related_name="instances")
    device = models.CharField(max_length=32)
    state = models.CharField(max_length=16, choices=InstanceState.choices, default=InstanceState.LOADING)
    load_options = LoadOptionsField()
    memory_bytes = models.BigIntegerField(default=0)
    max_sessions = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_configured = models.PositiveIntegerField(null=True, blank=True)
    context_window = models.PositiveIntegerField(null=True, blank=True)
    context_window_configured = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    loaded_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["served_name", "id"]

    def __str__(self) -> str:
        return f"{self.served_name}@{self.device} ({self.state})"
