"""Expired tokens: the periodic work writes one token_expired audit event per token, once, with its expiry."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from pantheon_site.audit import verify_audit_log
from pantheon_site.models import AuditEvent
from pantheon_site.token_expiry import record_expired_tokens
from pantheon_site.tokens import do_create_token, do_revoke_token

pytestmark = pytest.mark.django_db


def _expired_events() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(operation="token_expired").order_by("id"))


def test_a_token_past_its_expiry_gets_one_event_with_its_expiry():
    now = timezone.now()
    gone, _ = do_create_token("client", "gone", expires_at=now - timedelta(minutes=5))
    do_create_token("client", "later", expires_at=now + timedelta(days=1))
    do_create_token("client", "forever")
    assert record_expired_tokens(now=now) == ["gone"]
    [event] = _expired_events()
    assert (event.outcome, event.actor_kind, event.reason) == ("accepted", "system", "token_expired")
    assert event.details == {"label": "gone", "role": "client", "expires_at": gone.expires_at.isoformat()}
    assert record_expired_tokens(now=now + timedelta(hours=1)) == []  # once: the next runs add nothing
    assert len(_expired_events()) == 1
    assert verify_audit_log().intact


def test_a_token_gets_its_event_when_it_crosses_its_expiry():
    now = timezone.now()
    do_create_token("operator", "ops", expires_at=now + timedelta(hours=1))
    assert record_expired_tokens(now=now) == []
    assert record_expired_tokens(now=now + timedelta(hours=2)) == ["ops"]
    assert [e.details["label"] for e in _expired_events()] == ["ops"]


def test_a_token_revoked_before_it_expired_gets_no_expiry_event():
    now = timezone.now()
    do_create_token("client", "revoked", expires_at=now + timedelta(minutes=1))
    do_revoke_token("revoked")
    assert record_expired_tokens(now=now + timedelta(hours=1)) == []
    assert _expired_events() == []


def test_manage_run_periodic_runs_the_named_task_now():
    do_create_token("client", "gone", expires_at=timezone.now() - timedelta(minutes=5))
    out = StringIO()
    call_command("run_periodic", "record-expired-tokens", stdout=out)
    assert out.getvalue() == "record-expired-tokens: 1\n"
    assert [e.details["label"] for e in _expired_events()] == ["gone"]
    run = AuditEvent.objects.get(operation="periodic_run")
    assert (run.actor_kind, run.details) == ("cli", {"done": {"record-expired-tokens": 1}})
    with pytest.raises(CommandError, match="no periodic task nightly"):
        call_command("run_periodic", "nightly")
