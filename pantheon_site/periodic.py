"""The platform's own periodic tasks on Celery beat (scheduled by CELERY_BEAT_SCHEDULE; docs/periodic.md).

Each task only names a service function for Celery, so tests and manage.py call the same code."""

from celery import shared_task


@shared_task(name="pantheon_site.record_expired_tokens", ignore_result=True)
def record_expired_tokens() -> int:
    """One token_expired audit event per token that passed its expiry since the last run."""
    from pantheon_site.token_expiry import record_expired_tokens as record

    return len(record())


@shared_task(name="pantheon_site.prune_audit_log", ignore_result=True)
def prune_audit_log() -> int:
    """Audit retention: removes the events older than PANTHEON_AUDIT_RETENTION_DAYS (0: none), audited."""
    from pantheon_site.audit_retention import prune_audit_log as prune

    return prune().pruned
