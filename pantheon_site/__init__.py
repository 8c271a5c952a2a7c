"""Pantheon's Django project: settings, URLs, ASGI entry point, Celery app, and cross-cutting pieces."""
