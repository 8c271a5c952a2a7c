"""What every UI page shares: rendering with the navigation's section, notices, and the audited call of an action."""

from __future__ import annotations

from dataclasses import dataclass

from django.shortcuts import render

from pantheon_site.audit import AuditedCall, user_actor


@dataclass(frozen=True, slots=True)
class Notice:
    """One line above a page's content: what an action did ("ok") or why it was refused ("error")."""

    text: str
    kind: str = "ok"


def page(request, template: str, section: str, notices: list[Notice] | None = None, status_code: int = 200, **context):
    """Render one of the UI's templates with its navigation section marked and its notices shown."""
    return render(request, template, {"section": section, "notices": notices or [], **context}, status=status_code)


def ui_call(request, operation: str, *, model: str = "") -> AuditedCall:
    """The AuditedCall of a UI action: one audit event with the signed-in user as actor, accepted or refused with
    the error the action raised (`with` in sync views, `async with` in async ones)."""
    return AuditedCall(operation, model=model, **user_actor(request))
