"""The Celery app. Broker: REDIS_URL when set; otherwise tasks run eagerly in the caller (see settings.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

app = Celery("pantheon")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(related_name="periodic")
