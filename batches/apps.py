"""Django app config of the batches app."""

from django.apps import AppConfig


class BatchesConfig(AppConfig):
    """OpenAI's Files and Batch APIs: stored JSONL files, batches of requests run by Celery, and their lines."""

    name = "batches"
    verbose_name = "Batches"
