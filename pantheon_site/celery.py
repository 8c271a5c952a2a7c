"""The Celery app. Broker: REDIS_URL when set, else kombu's filesystem transport under the data folder; never eager
(settings.py, docs/celery.md).

Each app's tasks live in `<app>/tasks.py` and its periodic tasks, which beat's schedule (CELERY_BEAT_SCHEDULE) names,
in `<app>/periodic.py`: both are discovered here, so a worker knows every task the platform sends."""

import os

from celery import Celery

from pantheon_site import celery_parent

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")

app = Celery("pantheon")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(related_name="periodic")
celery_parent.install(app)  # --exit-with-parent, for serve's embedded worker
