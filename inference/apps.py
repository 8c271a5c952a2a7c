"""Django app config of the serving control plane."""

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    """Catalogue, workers and model instances; the routes and the supervisor live in this app too."""

    name = "inference"
    verbose_name = "Inference"
