"""manage.py create_token --role ROLE --label LABEL: the secret is printed once, as the last line."""

from datetime import timedelta

from django.utils import timezone

from pantheon_site.management.base import CommandResult, PantheonCommand
from pantheon_site.models import Role
from pantheon_site.tokens import do_create_token


class Command(PantheonCommand):
    help = "Create an access token. Its secret is printed once, as the last line, and stored nowhere."
    operation = "token_create"

    def add_arguments(self, parser):
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--label", required=True, help="a unique name people can read (shown in the audit log)")
        parser.add_argument("--expires-in-days", type=float, default=None, help="default: never expires")

    def perform(self, *, role, label, expires_in_days, **options) -> CommandResult:
        expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days is not None else None
        token, secret = do_create_token(role, label, expires_at=expires_at)
        expiry = f"expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else "does not expire"
        return CommandResult(
            lines=[
                f"Created {token.role} token {token.label!r} ({expiry}).",
                "Its secret follows; it is shown only now, so store it:",
                secret,
            ],
            details={"label": token.label, "role": token.role},
        )
