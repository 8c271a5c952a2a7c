"""Pantheon's Django project: settings, URLs, ASGI entry point, Celery app, and cross-cutting pieces."""

from pantheon_site.celery import app as celery_app

__all__ = ["celery_app"]
