"""Expired tokens in the audit log: one `token_expired` event per token, once, soon after it passes its expiry.

Authentication already refuses a token past `expires_at` (AccessToken.state), so nothing here is needed to end
access. What the periodic work adds is the record: revocation is audited when an operator revokes, but expiry
happens by itself, and without this the log would show when access ended only if someone presented the token again
(the refusal's reason `token_expired`). The event carries the exact `expires_at`; its own time is when the periodic
work noticed (within PANTHEON_TOKEN_EXPIRY_INTERVAL_S). A token revoked before it expired gets no event: its access
ended at the revocation, which is audited.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from pantheon_site.audit import record_audit_event
from pantheon_site.models import AccessToken, Outcome

OPERATION = "token_expired"


def record_expired_tokens(*, now: datetime | None = None) -> list[str]:
    """Writes the `token_expired` event of every unrevoked token past its expiry that has none yet; returns their
    labels. Each token is claimed with a conditional update in the event's transaction, so two runs at once write
    one event per token."""
    now = now or timezone.now()
    due = AccessToken.objects.filter(
        expires_at__lte=now, revoked_at__isnull=True, expiry_audited_at__isnull=True
    ).order_by("expires_at", "id")
    recorded = []
    for token in due:
        with transaction.atomic():
            claimed = AccessToken.objects.filter(pk=token.pk, expiry_audited_at__isnull=True).update(
                expiry_audited_at=now
            )
            if not claimed:
                continue
            record_audit_event(
                OPERATION,
                Outcome.ACCEPTED,
                actor_kind="system",
                reason="token_expired",
                details={"label": token.label, "role": token.role, "expires_at": token.expires_at.isoformat()},
            )
        recorded.append(token.label)
    return recorded
