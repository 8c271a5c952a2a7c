"""The tokens page: create (the secret is shown once, in the answer to the create itself), list, revoke.

Both actions go through pantheon_site/tokens.py, as `manage.py create_token` / `revoke_token` do, and are audited
as token_create / token_revoke with the signed-in user as actor. The secret exists only in the one response to the
POST that made it: a reload (a GET) can never show it again, since only its digest is stored.
"""

from datetime import UTC, datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_http_methods, require_POST

from admin_ui.views import common
from admin_ui.views.common import Notice, ui_call
from pantheon_site.errors import InvalidRequest, PantheonError
from pantheon_site.models import AccessToken, Role
from pantheon_site.tokens import do_create_token, do_revoke_token


def _render(request, notices: list[Notice] | None = None, created: tuple[AccessToken, str] | None = None):
    now = timezone.now()
    tokens = [(token, token.state(now)) for token in AccessToken.objects.order_by("-created_at", "label")]
    return common.page(
        request, "admin_ui/tokens.html", "tokens", notices, tokens=tokens, roles=Role.values, created=created
    )


def _expiry(text: str) -> datetime | None:
    """The form's optional expiry (a `datetime-local` value, read as UTC)."""
    if not text:
        return None
    moment = parse_datetime(text)
    if moment is None:
        raise InvalidRequest(f"expires: {text!r} is not a date and time", reason="bad_expiry")
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=UTC)


@require_http_methods(["GET", "POST"])
def page(request):
    """GET lists the tokens; POST creates one and answers with its secret."""
    if request.method == "GET":
        return _render(request)
    try:
        with ui_call(request, "token_create") as call:
            token, secret = do_create_token(
                request.POST.get("role", ""),
                request.POST.get("label", ""),
                expires_at=_expiry(request.POST.get("expires", "")),
            )
            call.details = {"label": token.label, "role": token.role}
    except PantheonError as error:
        return _render(request, [Notice(error.message, "error")])
    return _render(request, [Notice(f"Created {token.role} token {token.label!r}.")], created=(token, secret))


@require_POST
def revoke(request):
    label = request.POST.get("label", "")
    try:
        with ui_call(request, "token_revoke") as call:
            token = do_revoke_token(label)
            call.details = {"label": token.label, "role": token.role}
    except PantheonError as error:
        return _render(request, [Notice(error.message, "error")])
    return _render(request, [Notice(f"Revoked {token.role} token {token.label!r}.")])
