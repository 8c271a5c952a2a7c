"""The audit page's filters, read from a query string: one parser behind the list and both exports, so an export
holds exactly the events the list showed under the same query string.

Every filter is one that an index serves on the list's first page (newest first by id): each exact field has an
index of (field, -id), the time range has occurred_at's. The text search in reason has none; it reads newest-first
until a page is full, so a common word is quick and a rare one reads the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from pantheon_site.models import AuditEvent, Outcome

# The query string's filter names, in the form's order; the page's own paging (before/after) is not among them.
FILTER_NAMES = ("from", "to", "operation", "outcome", "actor", "model", "error_type", "q")


@dataclass(frozen=True)
class AuditFilter:
    """The events a query string selects (unordered), the values to show back in the form, and why the query
    string was refused ("" when it was not; the events are then none)."""

    events: QuerySet
    values: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def query_string(self) -> str:
        """The filters alone, urlencoded: what the export and paging links carry."""
        return urlencode({name: value for name, value in self.values.items() if value})


def _moment(name: str, text: str) -> datetime:
    """A `datetime-local` value (or any ISO date or date-time), read as UTC when it names no zone."""
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is None:
        raise ValueError(f"{name}: {text!r} is not a date and time")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


def filter_events(params) -> AuditFilter:
    """The audit events `params` (a request's GET) select: occurred_at from <= t < to, operation, outcome, model and
    error_type exactly, actor as an actor_label or an actor_kind, q anywhere in reason (case-insensitive)."""
    values = {name: params.get(name, "").strip() for name in FILTER_NAMES}
    try:
        conditions = _conditions(values)
    except ValueError as error:
        return AuditFilter(AuditEvent.objects.none(), values, str(error))
    return AuditFilter(AuditEvent.objects.filter(*conditions), values)


def _conditions(values: dict[str, str]) -> list[Q]:
    conditions = []
    if values["from"]:
        conditions.append(Q(occurred_at__gte=_moment("from", values["from"])))
    if values["to"]:
        conditions.append(Q(occurred_at__lt=_moment("to", values["to"])))
    if values["outcome"]:
        if values["outcome"] not in Outcome.values:
            raise ValueError(f"outcome: {values['outcome']!r} is not one of {', '.join(Outcome.values)}")
        conditions.append(Q(outcome=values["outcome"]))
    for name in ("operation", "model", "error_type"):
        if values[name]:
            conditions.append(Q(**{name: values[name]}))
    if values["actor"]:
        conditions.append(Q(actor_label=values["actor"]) | Q(actor_kind=values["actor"]))
    if values["q"]:
        conditions.append(Q(reason__icontains=values["q"]))
    return conditions
