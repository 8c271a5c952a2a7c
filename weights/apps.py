"""Django app config of the weights app."""

from django.apps import AppConfig


class WeightsConfig(AppConfig):
    """Weights attachment (the barrier routes), checkpoints and their lineage."""

    name = "weights"
    verbose_name = "Weights"
