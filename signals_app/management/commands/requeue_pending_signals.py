from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from signals_app.services import requeue_pending_signals


class Command(BaseCommand):
    help = (
        "Enqueue again the signals still pending some time after they were received, so that a "
        "broker that lost messages loses no signal. Safe to run at any time: processing is idempotent."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=settings.SIGNAL_SWEEP_AFTER_SECONDS,
            help="Seconds since a signal was received (default: SIGNAL_SWEEP_AFTER_SECONDS).",
        )
        parser.add_argument("--limit", type=int, default=100_000, help="At most this many signals (default 100000).")

    def handle(self, *args: Any, older_than: float, limit: int, **options: Any) -> None:
        count = requeue_pending_signals(older_than=timedelta(seconds=older_than), limit=limit)
        self.stdout.write(f"enqueued {count} pending signal(s)")
