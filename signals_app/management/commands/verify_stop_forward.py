from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from signals_app.verification import verify_stop_forward


def _moment(value: str) -> datetime:
    moment = parse_datetime(value)
    if moment is None or moment.tzinfo is None:
        raise CommandError(f"--since {value!r}: give an ISO 8601 time with its offset, e.g. 2026-11-30T00:00:00Z")
    try:
        moment.astimezone(UTC)  # the checks read hours in UTC
    except OverflowError:
        raise CommandError(f"--since {value!r}: out of range in UTC") from None
    return moment


class Command(BaseCommand):
    help = (
        "Prove the stop-forward promise from stored data alone: no attributed signal's user was "
        "left at any leave clock version between its receipt and processing checks, every gated "
        "reason agrees with the history, and every aggregate row equals what its attributed "
        "signals add up to, and no signal received before an erasure of its user remains. "
        "Names each counterexample; exits 1 on any."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--since", type=_moment, help="Only signals processed from then on, aggregate hours too.")
        parser.add_argument("--max-named", type=int, default=100, help="Name at most this many (default 100).")
        parser.add_argument("--no-progress", action="store_true", help="Do not show a progress bar.")

    def handle(self, *args: Any, since: datetime | None, max_named: int, no_progress: bool, **options: Any) -> None:
        if max_named < 0:
            raise CommandError(f"--max-named {max_named}: give 0 or more")
        result = verify_stop_forward(since=since, progress=not no_progress, max_named=max_named)
        for line in result.named:
            self.stderr.write(f"counterexample: {line}")
        self.stdout.write(
            f"signals checked: {result.signals_checked} (attributed {result.attributed}, gated {result.gated}, "
            f"without evidence {result.without_evidence})  aggregate rows checked: {result.aggregate_rows_checked}  "
            f"signals surviving an erasure: {result.erased_remaining}  "
            f"counterexamples: {result.counterexamples}"
        )
        if not result.passed:
            raise CommandError(f"{result.counterexamples} counterexample(s) to the stop-forward promise")
