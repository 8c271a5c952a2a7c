"""manage.py revoke_token LABEL: the token stops working at once; its row stays for the audit log."""

from pantheon_site.management.base import CommandResult, PantheonCommand
from pantheon_site.tokens import do_revoke_token


class Command(PantheonCommand):
    help = "Revoke the access token with this label."
    operation = "token_revoke"

    def add_arguments(self, parser):
        parser.add_argument("label")

    def perform(self, *, label, **options) -> CommandResult:
        token = do_revoke_token(label)
        return CommandResult(
            lines=[f"Revoked {token.role} token {token.label!r}."],
            details={"label": token.label, "role": token.role},
        )
