from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from community.ids import parse_user_id
from community.models import ChangeSource
from signals_app.erasure import users_erase


class Command(BaseCommand):
    help = (
        "Erase users: each leaves, every past contribution of theirs is taken back from the "
        "aggregates and their signals are deleted, one transaction per user, with a receipt in "
        "the history. Ids as arguments, or one per line on stdin with '-'. Prints one receipt a line."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("user_ids", nargs="+", help="User ids (0 to 2**63-1), or '-' to read them from stdin.")

    def handle(self, *args: Any, user_ids: list[str], **options: Any) -> None:
        tokens = [line.strip() for line in sys.stdin if line.strip()] if user_ids == ["-"] else user_ids
        ids = []
        for place, token in enumerate(tokens, start=1):
            try:
                ids.append(parse_user_id(token))
            except ValueError as exc:
                raise CommandError(f"user id #{place} {token!r}: {exc}") from None
        for receipt in users_erase(user_ids=ids, source=ChangeSource.COMMAND):
            already = " (already erased: nothing changed)" if receipt.already_erased else ""
            self.stdout.write(
                f"user {receipt.user_id}: erase v{receipt.version}, signals removed {receipt.signals_removed}, "
                f"aggregate rows changed {receipt.aggregate_rows_changed}{already}"
            )
