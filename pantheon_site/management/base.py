"""The base of Pantheon's management commands: one audit event per state-changing run, errors as CommandError.

A command implements `perform(**options) -> CommandResult`. The base times it, writes the audit event (actor_kind
"cli", actor_label the OS user) — accepted, or refused with the error — and only then prints the result's lines, so
whatever a command prints last (create_token's secret) really is the last line of its output.
"""

import getpass
import os
import time
from dataclasses import dataclass, field

from django.core.management.base import BaseCommand, CommandError

from pantheon_site.audit import record_audit_event
from pantheon_site.errors import PantheonError
from pantheon_site.models import Outcome


@dataclass(slots=True)
class CommandResult:
    """What a command did: the lines to print, and the model and details its audit event records."""

    lines: list[str] = field(default_factory=list)
    model: str = ""
    details: dict = field(default_factory=dict)


def os_user() -> str:
    """The operator's login name, for actor_label; the uid when the system has no name for it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def format_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Plain left-aligned columns, for the list commands."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [headers, *rows]
    ]


class PantheonCommand(BaseCommand):
    """Set `operation` on commands that change state (they are audited); leave it None on read-only ones.

    `audit_model(options)` names the model a refused run was about (a successful run returns it in its result).
    """

    operation: str | None = None

    def perform(self, **options) -> CommandResult:
        raise NotImplementedError

    def audit_model(self, options: dict) -> str:
        return ""

    def handle(self, *args, **options):
        started = time.monotonic()
        try:
            result = self.perform(**options)
        except Exception as exc:
            if self.operation is not None:
                self._audit_refusal(exc, options, started)
            if isinstance(exc, PantheonError):
                raise CommandError(exc.message) from exc
            raise
        if self.operation is not None:
            record_audit_event(
                self.operation,
                Outcome.ACCEPTED,
                actor_kind="cli",
                actor_label=os_user(),
                model=result.model,
                details=result.details,
                duration_ms=(time.monotonic() - started) * 1000.0,
            )
        for line in result.lines:
            self.stdout.write(line)

    def _audit_refusal(self, exc: Exception, options: dict, started: float) -> None:
        error = exc if isinstance(exc, PantheonError) else None
        record_audit_event(
            self.operation,
            Outcome.REFUSED,
            actor_kind="cli",
            actor_label=os_user(),
            error=error,
            error_type="" if error else ("invalid_request_error" if isinstance(exc, CommandError) else "server_error"),
            reason="" if error else str(exc),
            model=self.audit_model(options),
            duration_ms=(time.monotonic() - started) * 1000.0,
        )
