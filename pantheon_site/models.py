"""Cross-cutting records every app uses: access tokens and the append-only audit log."""

from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    """Who a token belongs to: operators run /admin/*, trainers attach to weights, clients call /v1."""

    OPERATOR = "operator"
    TRAINER = "trainer"
    CLIENT = "client"


class AccessToken(models.Model):
    """A bearer token: a label people can read, a role, and the HMAC digest of the secret — never the secret.

    The secret is shown once, at creation (`pantheon_site.tokens.do_create_token`). `prefix` is its first characters,
    public and indexed, so authentication finds the candidate rows without scanning and then compares the digest in
    constant time. A token is usable while it is neither revoked nor past `expires_at`.
    """

    label = models.CharField(max_length=100, unique=True)
    role = models.CharField(max_length=16, choices=Role.choices)
    digest = models.CharField(max_length=64, help_text="hex HMAC-SHA256 of the secret")
    prefix = models.CharField(max_length=16, db_index=True, help_text="first characters of the secret, for display")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["label"]

    def __str__(self) -> str:
        return f"{self.label} ({self.role})"

    def state(self, now=None) -> str:
        """active, revoked or expired — the word list_tokens shows and the audit reason uses."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or timezone.now()):
            return "expired"
        return "active"


class Outcome(models.TextChoices):
    """Whether the audited action was carried out or refused."""

    ACCEPTED = "accepted"
    REFUSED = "refused"


class AppendOnlyError(Exception):
    """Raised by any attempt to change or remove an audit event."""


class AuditEventQuerySet(models.QuerySet):
    """Queries over the audit log; the bulk paths that would change rows refuse."""

    def update(self, **kwargs):
        raise AppendOnlyError("audit events are append-only")

    def delete(self):
        raise AppendOnlyError("audit events are append-only")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AppendOnlyError("audit events are append-only")


class AuditEvent(models.Model):
    """One operator-visible action, accepted or refused: who, what, on which model, with which outcome and why.

    Written by `pantheon_site.audit.record_audit_event` for every operator route call (auth refusals included), every
    state-changing `manage.py` command and every worker crash. Rows are append-only: saving an existing row, deleting
    one and the queryset's update/delete all raise AppendOnlyError.
    """

    occurred_at = models.DateTimeField(default=timezone.now, db_index=True)
    operation = models.CharField(max_length=64, db_index=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_type = models.CharField(max_length=64, blank=True, help_text="the spec's error type when refused")
    reason = models.TextField(blank=True)
    actor_kind = models.CharField(max_length=16, help_text="token, anonymous, cli or system")
    actor_label = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["occurred_at", "id"]

    def __str__(self) -> str:
        return f"{self.occurred_at:%Y-%m-%d %H:%M:%S} {self.operation} {self.outcome}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError("audit events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("audit events are append-only")
