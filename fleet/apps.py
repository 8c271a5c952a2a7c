from django.apps import AppConfig


class FleetConfig(AppConfig):
    """The fleet: the router process (`manage.py router`) and what serve instances share with it (docs/fleet.md)."""

    name = "fleet"
