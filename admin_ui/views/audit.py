"""The audit log review page: the newest events first under the filters of admin_ui/audit_filters.py, one event's
every field, the filtered set as CSV or JSON lines, and the hash chain's verification.

The list pages by keyset on id (`before` = the oldest id shown, `after` = the newest) and counts nothing, so its
pages cost one indexed read of a page of rows however long the log grows; OFFSET and COUNT would read every row
before the page. Verifying the chain walks the whole log, so the page loads that box separately (htmx) and the list
never waits for it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from django.http import StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from admin_ui.audit_filters import filter_events
from admin_ui.views.common import Notice
from admin_ui.views.common import page as render_page
from pantheon_site.audit import event_as_dict, verify_audit_log
from pantheon_site.errors import InvalidRequest, NotFound
from pantheon_site.models import AuditEvent, Outcome

PAGE_SIZE = 50
EXPORT_CHUNK = 2000  # rows per database fetch, and per piece of the streamed body
# The CSV's columns: the export's JSON fields (event_as_dict), in its order; an unsaved event has them all.
CSV_COLUMNS = tuple(event_as_dict(AuditEvent()))


@dataclass(frozen=True)
class EventPage:
    """One page of the list, newest first, and whether there are newer and older events beyond it."""

    events: list[AuditEvent]
    newer: bool = False
    older: bool = False


def _keyset_page(events, before: int | None, after: int | None) -> EventPage:
    if after is not None:
        newer = list(events.filter(id__gt=after).order_by("id")[: PAGE_SIZE + 1])
        if len(newer) > PAGE_SIZE:
            # Older ones exist too: the page this link came from.
            return EventPage(newer[:PAGE_SIZE][::-1], newer=True, older=True)
        before = None  # less than a page is newer than `after`: that is the newest page
    if before is not None:
        events = events.filter(id__lt=before)
    rows = list(events.order_by("-id")[: PAGE_SIZE + 1])
    return EventPage(rows[:PAGE_SIZE], newer=before is not None, older=len(rows) > PAGE_SIZE)


def _cursor(params, name: str) -> int | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}: {text!r} is not an event id")
    return int(text)


def _link(query: str, **cursor: int) -> str:
    parts = [query] if query else []
    parts += [f"{name}={value}" for name, value in cursor.items()]
    return "?" + "&".join(parts)


@require_GET
def page(request):
    """The list under the query string's filters; a filter or cursor it cannot read shows why, over an empty list."""
    chosen = filter_events(request.GET)
    error, listing = chosen.error, EventPage([])
    if not error:
        try:
            listing = _keyset_page(chosen.events, _cursor(request.GET, "before"), _cursor(request.GET, "after"))
        except ValueError as exc:
            error = str(exc)
    query = chosen.query_string()
    return render_page(
        request,
        "admin_ui/audit.html",
        "audit",
        [Notice(error, "error")] if error else [],
        listing=listing,
        filters=chosen.values,
        outcomes=Outcome.values,
        query=query,
        newer_link=_link(query, after=listing.events[0].id) if listing.newer else "",
        older_link=_link(query, before=listing.events[-1].id) if listing.older else "",
    )


@require_GET
def detail(request, event_id: int):
    event = AuditEvent.objects.filter(pk=event_id).first()
    if event is None:
        raise NotFound(f"no audit event with id {event_id}", reason="audit_event_unknown")
    details = json.dumps(event.details, indent=2, sort_keys=True, ensure_ascii=False)
    return render_page(request, "admin_ui/audit_detail.html", "audit", event=event, details=details)


async def _pieces(events, render_event: Callable[[AuditEvent], str]) -> AsyncIterator[str]:
    """The rendered events, joined into one piece per database chunk: a long export is a few hundred sends, not one
    per row."""
    piece = []
    async for event in events:
        piece.append(render_event(event))
        if len(piece) == EXPORT_CHUNK:
            yield "".join(piece)
            piece = []
    if piece:
        yield "".join(piece)


def _export(request, suffix: str, content_type: str, header: str, render_event: Callable[[AuditEvent], str]):
    """The events of the list's filters, oldest first (the order they were written and chained, as `manage.py audit`
    prints them), streamed as they are read.

    The body is an async iterator even though the view is sync: daphne serves Django through ASGI, where a sync
    iterator would be read whole into memory before the first byte went out."""
    chosen = filter_events(request.GET)
    if chosen.error:
        raise InvalidRequest(chosen.error, reason="audit_filter")

    async def body():
        yield header
        async for piece in _pieces(chosen.events.order_by("id").aiterator(chunk_size=EXPORT_CHUNK), render_event):
            yield piece

    filename = f"audit-{timezone.now():%Y%m%dT%H%M%SZ}.{suffix}"
    return StreamingHttpResponse(
        body(), content_type=content_type, headers={"Content-Disposition": f'attachment; filename="{filename}"'}
    )


class _Echo:
    """A file whose write returns what it is given, so csv.writer's writerow returns the row's line."""

    def write(self, text: str) -> str:
        return text


# Holds no state of its own (each writerow formats one line), so one serves every export.
_CSV = csv.writer(_Echo())


def _csv_line(event: AuditEvent) -> str:
    fields = event_as_dict(event)
    fields["details"] = json.dumps(fields["details"], sort_keys=True, ensure_ascii=False)
    return _CSV.writerow([fields[name] for name in CSV_COLUMNS])


def _json_line(event: AuditEvent) -> str:
    return json.dumps(event_as_dict(event), ensure_ascii=False) + "\n"


@require_GET
def export_csv(request):
    """One header row, then one row per event; details is a JSON object in its cell."""
    return _export(request, "csv", "text/csv; charset=utf-8", _CSV.writerow(CSV_COLUMNS), _csv_line)


@require_GET
def export_jsonl(request):
    """One JSON object per line, per event (event_as_dict, as `manage.py audit --json` gives them)."""
    return _export(request, "jsonl", "application/x-ndjson; charset=utf-8", "", _json_line)


@require_GET
def verify(request):
    """The chain's verification, as the partial the audit page loads into its status box."""
    return render(request, "admin_ui/audit_verify.html", {"report": verify_audit_log()})
