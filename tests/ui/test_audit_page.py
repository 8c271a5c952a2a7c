"""The audit log review page (/ui/audit/): what an operator sees when filtering, paging, opening one event, exporting
and checking the hash chain."""

import csv
import html
import io
import json
import re
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from pantheon_site.audit import event_as_dict, record_audit_event
from pantheon_site.audit_chain import TABLE, install_trigger, remove_trigger
from pantheon_site.errors import InvalidRequest
from pantheon_site.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user("ops-admin", password="x" * 12, is_staff=True))
    return client


def _event(operation: str = "model_list", outcome: str = "accepted", **fields) -> AuditEvent:
    return record_audit_event(operation, outcome, **{"actor_kind": "cli", **fields})


def _listed(response) -> list[int]:
    """The event ids of the list's rows, top to bottom."""
    assert response.status_code == 200
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)"', response.content.decode())]


def _link(response, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]*)" rel="{rel}">', response.content.decode())
    return html.unescape(found[1]) if found else None


def _body(response) -> str:
    """A streamed export's body, read as ASGI reads it (asynchronously): the export must not need buffering."""

    async def read() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(read)().decode()


def test_operation_and_actor_find_the_one_revocation(staff):
    wanted = _event("token_revoke", actor_kind="user", actor_label="alice")
    _event("token_revoke", actor_kind="user", actor_label="bob")
    _event("token_create", actor_kind="user", actor_label="alice")
    assert _listed(staff.get("/ui/audit/", {"operation": "token_revoke", "actor": "alice"})) == [wanted.id]


def test_actor_matches_a_kind_and_the_other_filters_are_exact(staff):
    system = _event("worker_crash", "refused", actor_kind="system", model="tiny", error_type="server_error")
    _event("worker_crash", "refused", actor_kind="system", model="tiny-2", error_type="server_error")
    _event("model_load", "refused", actor_kind="cli", model="tiny", error_type="invalid_request_error")
    query = {"actor": "system", "outcome": "refused", "model": "tiny", "error_type": "server_error"}
    assert _listed(staff.get("/ui/audit/", query)) == [system.id]
    assert _listed(staff.get("/ui/audit/", {"outcome": "accepted"})) == []


def test_time_range_is_from_inclusive_to_exclusive_in_utc(staff):
    def at(hour: int) -> AuditEvent:
        return AuditEvent.objects.create(
            operation="model_list",
            outcome="accepted",
            actor_kind="cli",
            occurred_at=datetime(2024, 5, 1, hour, tzinfo=UTC),
        )

    early, middle, late = at(9), at(12), at(15)
    assert _listed(staff.get("/ui/audit/", {"from": "2024-05-01T12:00", "to": "2024-05-01T15:00"})) == [middle.id]
    assert _listed(staff.get("/ui/audit/", {"to": "2024-05-01T12:00"})) == [early.id]
    assert _listed(staff.get("/ui/audit/", {"from": "2024-05-01T10:00"})) == [late.id, middle.id]


def test_text_search_finds_words_in_the_reason_in_any_case(staff):
    found = _event("model_load", "refused", reason="Out of GPU memory")
    _event("model_load", "refused", reason="checkpoint missing")
    assert _listed(staff.get("/ui/audit/", {"q": "gpu MEMORY"})) == [found.id]


@pytest.mark.parametrize(
    "query", [{"from": "yesterday"}, {"to": "2024-13-40T99:00"}, {"outcome": "maybe"}, {"before": "ten"}]
)
def test_a_filter_it_cannot_read_shows_why_over_an_empty_list(staff, query):
    _event()
    response = staff.get("/ui/audit/", query)
    assert _listed(response) == []
    assert 'class="notice error"' in response.content.decode()
    assert "No audit events match." in response.content.decode()


def test_paging_walks_to_older_events_without_repeats_and_keeps_the_filter(staff):
    # 130 events, alternating operations: 65 match, a full page and 15 more.
    AuditEvent.objects.bulk_create(
        [AuditEvent(operation=("a", "b")[i % 2], outcome="accepted", actor_kind="cli") for i in range(130)]
    )
    matching = list(AuditEvent.objects.filter(operation="a").order_by("-id").values_list("id", flat=True))
    first = staff.get("/ui/audit/", {"operation": "a"})
    assert _listed(first) == matching[:50]
    assert _link(first, "prev") is None
    second = staff.get("/ui/audit/" + _link(first, "next"))
    assert _listed(second) == matching[50:]
    assert _link(second, "next") is None
    assert _listed(staff.get("/ui/audit/" + _link(second, "prev"))) == matching[:50]


def test_the_page_links_exports_of_its_filters_and_loads_the_chain_check_apart(staff):
    content = staff.get("/ui/audit/", {"operation": "token_revoke", "q": "a b"}).content.decode()
    assert f'href="{reverse("ui:audit-export-csv")}?operation=token_revoke&amp;q=a+b"' in content
    assert f'href="{reverse("ui:audit-export-jsonl")}?operation=token_revoke&amp;q=a+b"' in content
    assert f'hx-get="{reverse("ui:audit-verify")}" hx-trigger="load"' in content


def test_detail_shows_every_field_of_the_event(staff):
    event = _event(
        "token_create",
        "refused",
        actor_kind="token",
        actor_label="ci-bot",
        model="stories",
        error=InvalidRequest("label taken", reason="label_taken"),
        request_id="req-1234",
        client_address="10.0.0.7",
        duration_ms=12.5,
        details={"label": "ci", "role": "operator", "note": "café"},
    )
    content = staff.get(reverse("ui:audit-detail", args=[event.id])).content.decode()
    for shown in ("token_create", "refused", "invalid_request_error", "label_taken", "ci-bot", "stories", "req-1234"):
        assert shown in content
    assert "10.0.0.7" in content and "12.5 ms" in content
    assert html.escape('"role": "operator"') in content and "café" in content  # pretty-printed, as written
    assert event.row_hash in content and event.previous_hash in content


def test_an_unknown_event_is_a_404_page(staff):
    response = staff.get(reverse("ui:audit-detail", args=[999999]))
    assert response.status_code == 404
    assert "no audit event with id 999999" in response.content.decode()


def test_csv_export_has_a_header_and_exactly_the_filtered_rows_oldest_first(staff):
    revokes = [_event("token_revoke", actor_label="alice", details={"n": i}) for i in range(3)]
    _event("token_create", actor_label="alice")
    response = staff.get(reverse("ui:audit-export-csv"), {"operation": "token_revoke"})
    assert response.status_code == 200
    assert re.fullmatch(r'attachment; filename="audit-\w+\.csv"', response["Content-Disposition"])
    header, *rows = list(csv.reader(io.StringIO(_body(response))))
    assert header == list(event_as_dict(revokes[0]))
    assert [int(row[0]) for row in rows] == [e.id for e in revokes]
    assert [json.loads(row[header.index("details")]) for row in rows] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_json_lines_export_parses_and_matches_the_events(staff):
    chosen = [_event("model_load", "refused", reason=f"no room {i}") for i in range(2)]
    _event("model_load", "accepted")
    response = staff.get(reverse("ui:audit-export-jsonl"), {"outcome": "refused"})
    assert re.fullmatch(r'attachment; filename="audit-\w+\.jsonl"', response["Content-Disposition"])
    lines = [json.loads(line) for line in _body(response).splitlines()]
    assert lines == [json.loads(json.dumps(event_as_dict(e))) for e in chosen]


def test_an_export_with_a_filter_it_cannot_read_is_refused(staff):
    response = staff.get(reverse("ui:audit-export-csv"), {"from": "not a date"})
    assert response.status_code == 400
    assert "not a date" in response.content.decode()


def test_verify_says_intact_then_names_the_altered_event(staff):
    events = [_event(reason=f"event {i}") for i in range(4)]
    assert "Hash chain intact: 4 events verified." in staff.get(reverse("ui:audit-verify")).content.decode()
    remove_trigger(connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {TABLE} SET reason = %s WHERE id = %s", ["nothing happened", events[2].id])
    finally:
        install_trigger(connection)
    content = staff.get(reverse("ui:audit-verify")).content.decode()
    assert (
        f'broken at event\n  <a href="{reverse("ui:audit-detail", args=[events[2].id])}">{events[2].id}</a>' in content
    )
    assert "altered" in content


@pytest.mark.parametrize(
    "url",
    ["/ui/audit/", "/ui/audit/1/", "/ui/audit/export.csv", "/ui/audit/export.jsonl", "/ui/audit/verify/"],
)
def test_anonymous_visitors_are_sent_to_sign_in(url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/ui/login/")
