"""Cross-cutting records every app uses: access tokens and the append-only, hash-chained audit log."""

from django.db import models, transaction
from django.utils import timezone

from pantheon_site.audit_chain import GENESIS, chain_hash


class Role(models.TextChoices):
    """Who a token belongs to: operators run /admin/*, trainers attach to weights, clients call /v1."""

    OPERATOR = "operator"
    TRAINER = "trainer"
    CLIENT = "client"


class AccessToken(models.Model):
    """A bearer token: a label people can read, a role, and the HMAC digest of the secret — never the secret.

    The secret is shown once, at creation (`pantheon_site.tokens.do_create_token`). `prefix` is its first characters,
    public and indexed, so authentication finds the candidate rows without scanning and then compares the digest in
    constant time. A token is usable while it is neither revoked nor past `expires_at`. `expiry_audited_at` is when
    the periodic work recorded its `token_expired` event (pantheon_site/token_expiry.py), so it is recorded once.
    """

    label = models.CharField(max_length=100, unique=True)
    role = models.CharField(max_length=16, choices=Role.choices)
    digest = models.CharField(max_length=64, help_text="hex HMAC-SHA256 of the secret")
    prefix = models.CharField(max_length=16, db_index=True, help_text="first characters of the secret, for display")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    expiry_audited_at = models.DateTimeField(
        null=True, blank=True, help_text="when its token_expired event was written"
    )

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
    """Queries over the audit log; the bulk paths that would change rows refuse, and bulk_create chains its rows."""

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        with transaction.atomic(using=self.db):
            head = AuditChainHead.locked(self.db)
            for event in objs:
                head.chain(event)
            created = super().bulk_create(objs, *args, **kwargs)
            head.save(using=self.db)
        return created

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
    one and the queryset's update/delete all raise AppendOnlyError, and below the ORM a database trigger refuses
    changes (pantheon_site/audit_chain.py). Each row's `row_hash` chains it to the row written before it.
    """

    occurred_at = models.DateTimeField(default=timezone.now, db_index=True)
    operation = models.CharField(max_length=64, db_index=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error_type = models.CharField(max_length=64, blank=True, help_text="the spec's error type when refused")
    reason = models.TextField(blank=True)
    actor_kind = models.CharField(max_length=16, help_text="token, user, anonymous, cli or system")
    actor_label = models.CharField(max_length=100, blank=True)
    model = models.CharField(max_length=200, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    client_address = models.CharField(max_length=64, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)
    previous_hash = models.CharField(max_length=64, blank=True, help_text="row_hash of the event written before")
    row_hash = models.CharField(max_length=64, blank=True, help_text="sha256 of previous_hash and this row's content")

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["occurred_at", "id"]
        # The audit page lists newest first by id under any one filter; each index serves one filter's first page.
        indexes = [
            models.Index(fields=[name, "-id"], name=f"audit_{name}_id")
            for name in ("operation", "outcome", "actor_kind", "actor_label", "model", "error_type")
        ]

    def __str__(self) -> str:
        return f"{self.occurred_at:%Y-%m-%d %H:%M:%S} {self.operation} {self.outcome}"

    def save(self, *args, using=None, **kwargs):
        if not self._state.adding:
            raise AppendOnlyError("audit events are append-only")
        using = using or "default"
        with transaction.atomic(using=using):
            head = AuditChainHead.locked(using)
            head.chain(self)
            super().save(*args, using=using, **kwargs)
            head.save(using=using)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("audit events are append-only")


class AuditChainHead(models.Model):
    """The one row holding the newest audit event's hash: the lock writers take to chain in turn, and what tells
    `manage.py audit --verify` that no newest events were removed."""

    last_hash = models.CharField(max_length=64, default=GENESIS)

    HEAD_ID = 1

    @classmethod
    def locked(cls, using: str) -> "AuditChainHead":
        """The head, locked until the transaction ends; made (from the newest event) when the table has none, as
        after Django empties the tables between tests."""
        if not cls.objects.using(using).filter(pk=cls.HEAD_ID).exists():
            newest = AuditEvent.objects.using(using).order_by("-id").values_list("row_hash", flat=True).first()
            cls.objects.using(using).bulk_create(
                [cls(pk=cls.HEAD_ID, last_hash=newest or GENESIS)], ignore_conflicts=True
            )
        return cls.objects.using(using).select_for_update().get(pk=cls.HEAD_ID)

    def chain(self, event: AuditEvent) -> None:
        """Link `event` to the head and make it the new head (saved by the caller, in the same transaction)."""
        event.previous_hash = self.last_hash
        event.row_hash = chain_hash(self.last_hash, event)
        self.last_hash = event.row_hash
