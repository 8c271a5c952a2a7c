"""Django app config of the weights app."""

from django.apps import AppConfig


class WeightsConfig(AppConfig):
    """Weights attachment and checkpoints; no models or routes yet."""

    name = "weights"
    verbose_name = "Weights"
