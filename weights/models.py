"""Checkpoints a trainer saved from served weights, and their lineage (each names the checkpoint it descends from)."""

from django.db import models
from django.utils import timezone


class Checkpoint(models.Model):
    """One saved step: `checkpoints/<run_id>/step-<step>/` with its manifest, and the catalogue row that serves it.

    `name` is the qualified name `<base_model>:<run_id>:step-<step>`, which is also the served name once saved and
    the catalogue row's name. `parent` is the checkpoint the saved weights were loaded or saved from before (null:
    they descend from the base model directly). `weights_sha256` is the manifest's digest of model.safetensors.
    """

    name = models.CharField(max_length=200, unique=True)
    run_id = models.CharField(max_length=100)
    step = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    base_model = models.CharField(max_length=200, help_text="the base model's served name")
    weights_sha256 = models.CharField(max_length=64)
    path = models.CharField(max_length=1024)
    created_at = models.DateTimeField(default=timezone.now)
    saved_by = models.CharField(max_length=100, blank=True, help_text="the label of the token that saved it")
    catalog = models.ForeignKey("inference.CatalogModel", null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run_id", "step", "base_model"], name="one_step_per_run")]

    def __str__(self) -> str:
        return self.name
