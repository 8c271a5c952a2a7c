"""The audit log: append-only rows, and one event for every state-changing command (none for read-only ones)."""

import asyncio
import getpass
from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command
from django.db import close_old_connections
from rest_framework import exceptions as drf

from pantheon_site.audit import AuditedCall, record_audit_event
from pantheon_site.errors import ServerBusy
from pantheon_site.management.base import PantheonCommand
from pantheon_site.models import AppendOnlyError, AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def event():
    return record_audit_event(
        "model_load",
        "refused",
        actor_kind="token",
        actor_label="ops",
        error=ServerBusy("busy", reason="queue_full"),
        model="stories",
        request_id="abc",
        client_address="127.0.0.1",
        duration_ms=1.5,
    )


def test_an_event_records_who_what_and_why(event):
    row = AuditEvent.objects.get(pk=event.pk)
    assert (row.operation, row.outcome, row.error_type, row.reason) == (
        "model_load",
        "refused",
        "server_busy",
        "queue_full",
    )
    assert (row.actor_kind, row.actor_label, row.model) == ("token", "ops", "stories")
    assert (row.request_id, row.client_address, row.duration_ms) == ("abc", "127.0.0.1", 1.5)
    assert row.details == {"message": "busy"}
    assert row.occurred_at is not None


def test_a_refusal_about_an_over_long_name_is_recorded_cut_to_the_column():
    path = "/models/" + "x" * 300  # what a hostile load names; PostgreSQL refuses it whole in a 200-char column
    record_audit_event("model_load", "refused", actor_kind="token", model=path)
    stored = AuditEvent.objects.get().model
    limit = AuditEvent._meta.get_field("model").max_length
    assert len(stored) == limit and stored.startswith("/models/xxx") and stored.endswith("…")


def test_outcome_must_be_accepted_or_refused():
    with pytest.raises(ValueError):
        record_audit_event("x", "maybe", actor_kind="cli")
    assert not AuditEvent.objects.exists()


def test_events_cannot_be_changed(event):
    event.reason = "rewritten"
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(reason="rewritten")
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.bulk_update([event], ["reason"])
    assert AuditEvent.objects.get(pk=event.pk).reason == "queue_full"


def test_events_cannot_be_deleted(event):
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_state_changing_commands_write_one_event_each():
    out = StringIO()
    call_command("create_token", role="operator", label="ops", stdout=out)
    call_command("revoke_token", "ops", stdout=out)
    events = list(AuditEvent.objects.order_by("id"))
    assert [(e.operation, e.outcome) for e in events] == [("token_create", "accepted"), ("token_revoke", "accepted")]
    assert {(e.actor_kind, e.actor_label) for e in events} == {("cli", getpass.getuser())}
    assert events[0].details == {"label": "ops", "role": "operator"}
    assert all(e.duration_ms is not None and e.duration_ms >= 0 for e in events)


def test_refused_commands_are_audited_too():
    call_command("create_token", role="operator", label="ops", stdout=StringIO())
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_token", role="client", label="ops", stdout=StringIO())
    with pytest.raises(CommandError, match="no token labelled"):
        call_command("revoke_token", "ghost", stdout=StringIO())
    refused = list(AuditEvent.objects.filter(outcome="refused").order_by("id"))
    assert [(e.operation, e.error_type, e.reason) for e in refused] == [
        ("token_create", "invalid_request_error", "duplicate_label"),
        ("token_revoke", "not_found", "unknown_label"),
    ]


def test_read_only_commands_write_nothing():
    for name in ["list_tokens", "audit", "list_models", "devices"]:
        call_command(name, stdout=StringIO())
    assert not AuditEvent.objects.exists()


def fields_of(event) -> tuple:
    return (event.operation, event.outcome, event.error_type, event.reason, event.actor_kind, event.model)


def test_an_audited_call_records_what_it_acted_on_once_it_ends():
    with AuditedCall("model_load", model="asked-for", actor_kind="cli", actor_label="ops") as call:
        call.model, call.details = "loaded", {"device": "cpu"}
        assert not AuditEvent.objects.exists()  # written when the call ends, with what it learned meanwhile
    event = AuditEvent.objects.get()
    assert fields_of(event) == ("model_load", "accepted", "", "", "cli", "loaded")
    assert event.details == {"device": "cpu"} and event.actor_label == "ops" and event.duration_ms >= 0


@pytest.mark.parametrize(
    ("raised", "error_type", "reason"),
    [
        (ServerBusy("busy", reason="queue_full"), "server_busy", "queue_full"),
        (drf.ValidationError({"path": ["This field is required."]}), "invalid_request_error", "validation"),
        (KeyError("path"), "server_error", "KeyError"),
    ],
)
def test_an_audited_call_that_raises_is_refused_with_the_mapped_error(raised, error_type, reason):
    with pytest.raises(type(raised)), AuditedCall("model_load", model="m", actor_kind="system"):
        raise raised
    assert fields_of(AuditEvent.objects.get()) == ("model_load", "refused", error_type, reason, "system", "m")


def test_calls_that_write_no_event():
    with pytest.raises(KeyboardInterrupt), AuditedCall("model_load", actor_kind="cli"):
        raise KeyboardInterrupt  # interrupted: neither accepted nor refused
    with AuditedCall("model_load", actor_kind="cli") as call:
        call.audited_elsewhere = True  # e.g. the server a command forwarded the call to
    with AuditedCall(None, actor_kind="cli"):  # a read-only command
        pass
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_an_async_audited_call_writes_the_same_events_and_none_when_cancelled():
    async with AuditedCall("model_unload", model="m", actor_kind="system"):
        pass
    with pytest.raises(asyncio.CancelledError):
        async with AuditedCall("model_unload", actor_kind="system"):
            raise asyncio.CancelledError
    events = [fields_of(e) async for e in AuditEvent.objects.all()]
    assert events == [("model_unload", "accepted", "", "", "system", "m")]
    await sync_to_async(close_old_connections)()


class FailingCommand(PantheonCommand):
    operation = "token_create"

    def perform(self, **options):
        raise CommandError("give a label")


def test_a_command_error_is_audited_as_an_invalid_request():
    with pytest.raises(CommandError, match="give a label"):
        call_command(FailingCommand(), stdout=StringIO())
    event = AuditEvent.objects.get()
    assert fields_of(event) == ("token_create", "refused", "invalid_request_error", "command_error", "cli", "")
    assert event.details == {"message": "give a label"}
