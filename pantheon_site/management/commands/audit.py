"""manage.py audit: read the audit log, newest last, filtered by time, operation, outcome or actor; or, with
--verify, check its hash chain and name the first broken row (exit status 1 when it is broken)."""

import json
import re
from datetime import UTC, datetime, timedelta

from django.core.management.base import CommandError
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from pantheon_site.audit import event_as_dict, verify_audit_log
from pantheon_site.management.base import CommandResult, PantheonCommand, format_table
from pantheon_site.models import AuditEvent, Outcome

_RELATIVE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str):
    """An aware datetime from "30m", "2h", "7d", "90s" (ago), or an ISO date or date-time (UTC when naive)."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        return timezone.now() - timedelta(seconds=float(relative[1]) * _UNIT_SECONDS[relative[2]])
    moment = parse_datetime(text)
    if moment is None and (day := parse_date(text)) is not None:
        moment = datetime(day.year, day.month, day.day)
    if moment is None:
        raise CommandError(f"--since {text!r}: give an ISO date or time, or an age like 30m, 2h, 7d")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


class Command(PantheonCommand):
    help = "Show audit events, oldest first, ending with the most recent."

    def add_arguments(self, parser):
        parser.add_argument("--since", help='ISO date/time, or an age such as "30m", "2h", "7d"')
        parser.add_argument("--operation", help="exact operation name, e.g. model_load, token_create")
        parser.add_argument("--outcome", choices=Outcome.values)
        parser.add_argument("--actor", help="an actor label (token label or OS user) or kind (token, cli, system)")
        parser.add_argument("--limit", type=int, default=200, help="show at most this many of the newest (default 200)")
        parser.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
        parser.add_argument("--verify", action="store_true", help="check the hash chain of the whole log instead")

    def perform(self, *, since, operation, outcome, actor, limit, **options) -> CommandResult:
        if options["verify"]:
            report = verify_audit_log()
            if not report.intact:
                raise CommandError(report.describe())
            return CommandResult(lines=[report.describe()])
        events = AuditEvent.objects.all()
        if since:
            events = events.filter(occurred_at__gte=parse_since(since))
        if operation:
            events = events.filter(operation=operation)
        if outcome:
            events = events.filter(outcome=outcome)
        if actor:
            events = events.filter(Q(actor_label=actor) | Q(actor_kind=actor))
        newest = list(events.order_by("-occurred_at", "-id")[: max(limit, 0)])
        chosen = list(reversed(newest))
        if options["json"]:
            return CommandResult(lines=[json.dumps([event_as_dict(e) for e in chosen], indent=2)])
        if not chosen:
            return CommandResult(lines=["No audit events match."])
        rows = [
            [
                f"{e.occurred_at:%Y-%m-%d %H:%M:%S}",
                e.operation,
                e.outcome,
                e.error_type or "-",
                f"{e.actor_kind}:{e.actor_label}" if e.actor_label else e.actor_kind,
                e.model or "-",
                e.reason or "-",
            ]
            for e in chosen
        ]
        return CommandResult(
            lines=format_table(["TIME", "OPERATION", "OUTCOME", "ERROR", "ACTOR", "MODEL", "REASON"], rows)
        )
