"""Django app config of the operator UI."""

from django.apps import AppConfig


class AdminUiConfig(AppConfig):
    """The operator UI; it owns no business logic and, so far, no views."""

    name = "admin_ui"
    verbose_name = "Operator UI"
