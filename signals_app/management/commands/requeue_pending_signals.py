from __future__ import annotations

import argparse
import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from signals_app.services.sweep import pending_signals_requeue

MAX_SECONDS = 10 * 366 * 86400  # ten years: older than any signal still pending


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_SECONDS:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{value!r}: give a number of seconds from 0 to {MAX_SECONDS}")
    return seconds


def _count(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of at least 1")
    return int(value)


class Command(BaseCommand):
    help = (
        "Enqueue again the signals still pending some time after they were received, so that a "
        "broker that lost messages loses no signal. Safe to run at any time: processing is idempotent."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than",
            type=_seconds,
            default=settings.SIGNAL_SWEEP_AFTER_SECONDS,
            help="Seconds since a signal was received (default: SIGNAL_SWEEP_AFTER_SECONDS).",
        )
        parser.add_argument("--limit", type=_count, default=100_000, help="At most this many signals (default 100000).")
        parser.add_argument(
            "--force",
            action="store_true",
            help="Also those whose task was sent and may still wait in the queue (by default they are "
            "enqueued again only once the queue is empty).",
        )

    def handle(self, *args: Any, older_than: float, limit: int, force: bool, **options: Any) -> None:
        report = pending_signals_requeue(older_than=timedelta(seconds=older_than), limit=limit, force=force)
        line = f"enqueued {report.enqueued} pending signal(s)"
        if report.deferred:
            line += f"; {report.deferred} left alone: {report.queued_tasks} task(s) still queued (--force to send)"
        self.stdout.write(line)
