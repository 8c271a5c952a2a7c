"""Django app config of the weights app."""

from django.apps import AppConfig

from pantheon_site.health_sections import add_health_section


class WeightsConfig(AppConfig):
    """Weights attachment (the barrier routes), checkpoints and their lineage."""

    name = "weights"
    verbose_name = "Weights"

    def ready(self) -> None:
        """Adds the barrier summary to /api/health/detailed (the health route does not import this app)."""
        from weights.status import health_summary  # imports models: only once the apps are ready

        add_health_section("weights", health_summary)
