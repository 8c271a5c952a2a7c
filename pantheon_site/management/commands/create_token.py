"""manage.py create_token --role ROLE --label LABEL: the secret is printed once, as the last line.

With --secret-from-env NAME the secret is the one in that environment variable (a deployment's bootstrap operator
token, kept in its secret store: docs/deploy.md), never printed, and a second run with the same secret changes
nothing, so a setup job can run it on every upgrade. An environment variable rather than an argument: a command
line is visible to every user of the host (ps) and lands in shell histories.
"""

import os
from datetime import timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from pantheon_site.management.base import CommandResult, PantheonCommand
from pantheon_site.models import Role
from pantheon_site.tokens import do_create_token, do_install_token


class Command(PantheonCommand):
    help = "Create an access token. Its secret is printed once, as the last line, and stored nowhere."
    operation = "token_create"

    def add_arguments(self, parser):
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--label", required=True, help="a unique name people can read (shown in the audit log)")
        parser.add_argument("--expires-in-days", type=float, default=None, help="default: never expires")
        parser.add_argument(
            "--secret-from-env",
            metavar="NAME",
            help="take the secret from this environment variable (pth_ and 43 or more characters) instead of making "
            "one; it is not printed, and running again with the same secret changes nothing",
        )

    def perform(self, *, role, label, expires_in_days, secret_from_env=None, **options) -> CommandResult:
        if secret_from_env:
            return self._install(role, label, expires_in_days, secret_from_env)
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

    def _install(self, role: str, label: str, expires_in_days, variable: str) -> CommandResult:
        if expires_in_days is not None:
            raise CommandError("--expires-in-days and --secret-from-env do not go together: a bootstrap token is kept")
        secret = os.environ.get(variable, "")
        if not secret:
            raise CommandError(f"--secret-from-env: the environment variable {variable} is unset or empty")
        token, created = do_install_token(role, label, secret)
        said = "Created" if created else "Kept the existing"
        return CommandResult(
            lines=[f"{said} {token.role} token {token.label!r} with the secret from ${variable}."],
            details={"label": token.label, "role": token.role, "secret_from_env": variable, "created": created},
        )
