from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from signals_app.services.processing import failed_signals_retry


class Command(BaseCommand):
    help = (
        "Put signals whose processing failed (outcome 'failed', with their error) back to pending "
        "and enqueue them: run it once the cause is fixed. All of them, or the ids given."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("ids", nargs="*", type=int, help="Only these signal ids.")

    def handle(self, *args: Any, ids: list[int], **options: Any) -> None:
        count = failed_signals_retry(signal_ids=ids or None)
        self.stdout.write(f"enqueued {count} failed signal(s) again")
