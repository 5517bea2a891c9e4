from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.services import token_rotate


class Command(BaseCommand):
    help = (
        "Issue a new API token for an account and print it (last line); the account's other tokens "
        "keep working for the overlap (default TOKEN_ROTATION_OVERLAP_HOURS), then expire."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--overlap-hours", type=float, default=None, help="How long the old tokens keep working.")

    def handle(self, *args: Any, username: str, overlap_hours: float | None, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no account {username!r}")
        hours = settings.TOKEN_ROTATION_OVERLAP_HOURS if overlap_hours is None else overlap_hours
        if hours < 0:
            raise CommandError("--overlap-hours must be at least 0")
        instance, token, shortened = token_rotate(user=user, overlap=timedelta(hours=hours))
        self.stderr.write(f"{shortened} older token(s) of {username} now expire within {hours:g} hour(s)")
        self.stderr.write(f"new token expires {instance.expiry.isoformat() if instance.expiry else 'never'}")
        self.stdout.write(token)
