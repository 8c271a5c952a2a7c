"""manage.py list_tokens: label, role, state and dates of every token — never a secret or a digest."""

from django.utils import timezone

from pantheon_site.management.base import CommandResult, PantheonCommand, format_table
from pantheon_site.models import AccessToken


def _when(value) -> str:
    return f"{value:%Y-%m-%d %H:%M}" if value else "-"


class Command(PantheonCommand):
    help = "List access tokens (label, role, display prefix, state, created, last used, expires)."

    def perform(self, **options) -> CommandResult:
        now = timezone.now()
        tokens = AccessToken.objects.order_by("label")
        if not tokens:
            return CommandResult(lines=["No tokens. Create one with: manage.py create_token --role ROLE --label LABEL"])
        rows = [
            [
                t.label,
                t.role,
                f"{t.prefix}…",
                t.state(now),
                _when(t.created_at),
                _when(t.last_used_at),
                _when(t.expires_at),
            ]
            for t in tokens
        ]
        headers = ["LABEL", "ROLE", "PREFIX", "STATE", "CREATED", "LAST USED", "EXPIRES"]
        return CommandResult(lines=format_table(headers, rows))
