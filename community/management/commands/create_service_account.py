from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from community.permissions import SERVICE_PERMISSIONS
from community.services.service_accounts import service_account_create


class Command(BaseCommand):
    help = (
        "Create (or update) a service account: an account in the service-accounts group, with the "
        "given permissions (default: what a signals service needs), and print a new API token (last line). "
        "Earlier tokens keep working until they expire or are revoked; see rotate_token."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--perm",
            action="append",
            dest="perms",
            metavar="APP_LABEL.CODENAME",
            help=f"A permission to grant; repeat for more. Default: {', '.join(SERVICE_PERMISSIONS)}.",
        )

    def handle(self, *args: Any, username: str, perms: list[str] | None, **options: Any) -> None:
        try:
            token = service_account_create(username=username, perms=perms or list(SERVICE_PERMISSIONS))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(token)
