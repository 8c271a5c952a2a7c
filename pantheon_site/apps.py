"""Django app config of the project package, which owns the cross-cutting models (access tokens, audit events)."""

from django.apps import AppConfig


class PantheonSiteConfig(AppConfig):
    """Tokens and audit: the records every other app writes to."""

    name = "pantheon_site"
    verbose_name = "Pantheon"
