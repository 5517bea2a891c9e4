from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from community.services.rebuild import rebuild_leave_status


class Command(BaseCommand):
    help = (
        "Validate every stored leave record, report counts by status and every corrupt row, "
        "and make every running web and worker process re-warm its leave cache. "
        "Exits non-zero when any record is corrupt (those users stay gated: fail closed)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-progress", action="store_true", help="Do not show a progress bar.")

    def handle(self, *args: Any, no_progress: bool, **options: Any) -> None:
        report = rebuild_leave_status(progress=not no_progress)
        self.stdout.write(
            f"records: {report.total}  active: {report.active}  left: {report.left}  corrupt: {len(report.corrupt)}"
        )
        for user_id, raw in report.corrupt:
            self.stderr.write(f"corrupt record: user_id={user_id} value={raw.hex(' ') or '(empty)'}")
        self.stdout.write(f"leave cache generation is now {report.generation}: every process re-warms at its next sync")
        if report.corrupt:
            raise CommandError(f"{len(report.corrupt)} corrupt leave record(s); those users stay gated as left")
