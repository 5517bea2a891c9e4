from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from signals_app.demo import seed_demo


class Command(BaseCommand):
    help = (
        "Fill an empty database with demo data: communities, cohorts, members, a service account "
        "with a token, some users who left, and signals queued for the workers. Does nothing when "
        "demo data is already there."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--users", type=int, default=300, help="How many user ids (default 300).")
        parser.add_argument("--signals", type=int, default=3000, help="How many signals (default 3000).")
        parser.add_argument("--seed", type=int, default=7, help="Random seed (default 7).")

    def handle(self, *args: Any, users: int, signals: int, seed: int, **options: Any) -> None:
        report = seed_demo(users=users, signals=signals, seed=seed)
        if report is None:
            self.stdout.write("demo data is already there: nothing to do")
            return
        self.stdout.write(
            f"demo data: {report.communities} communities, {report.cohorts} cohorts, {report.users} users "
            f"({report.left} left), {report.signals} signals sent\n"
            f"service account 'demo-service', API token: {report.token}"
        )
