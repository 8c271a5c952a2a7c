"""The base of Pantheon's management commands: one audit event per state-changing run, errors as CommandError.

A command implements `perform(**options) -> CommandResult`. The base runs it as one AuditedCall (`self.audit`;
actor_kind "cli", actor_label the OS user), which writes the audit event — accepted, or refused with the error —
and only then prints the result's lines, so whatever a command prints last (create_token's secret) really is the
last line of its output. A command that hands its work to the running server sets `self.audit.audited_elsewhere`.
"""

import getpass
import os
import sys
from dataclasses import dataclass, field

from django.core.management.base import BaseCommand, CommandError

from pantheon_site.audit import AuditedCall
from pantheon_site.errors import InvalidRequest, PantheonError


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
    """Set `operation` on commands that change state (they are audited); leave it None on read-only ones (their
    AuditedCall writes nothing).

    `audit_model(options)` names the model a refused run was about (a successful run returns it in its result).
    """

    operation: str | None = None

    def perform(self, **options) -> CommandResult:
        raise NotImplementedError

    def audit_model(self, options: dict) -> str:
        return ""

    def handle(self, *args, **options):
        self.audit = AuditedCall(
            self.operation, model=self.audit_model(options), actor_kind="cli", actor_label=os_user()
        )
        try:
            with self.audit:
                result = self._perform(options)
                self.audit.model, self.audit.details = result.model, result.details
        except PantheonError as exc:
            raise CommandError(exc.message) from exc
        try:
            for line in result.lines:
                self.stdout.write(line)
            self.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader is gone, which is no error of the command's
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit

    def _perform(self, options: dict) -> CommandResult:
        try:
            return self.perform(**options)
        except CommandError as exc:  # Django's word for a bad invocation: audited as the request error it is
            raise InvalidRequest(str(exc), reason="command_error") from exc
