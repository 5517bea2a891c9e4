"""Plain helpers shared by the test modules: one definition each, imported from here.

Fixtures live in the conftest files; factories (accounts, their password, permission sets and
tokens) in ``tests.factories``; the real processes (a Celery worker) in ``tests.processes``;
the live server's HTTP client with cookies in ``tests.accounts.web``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management import call_command
from django.db import connections, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from community.models import Cohort, Community, CommunityLeave, LeaveClock, LeaveHistory
from community.services.groups import group_members_add
from signals_app.models import Signal
from signals_app.services.ingest import signals_ingest
from signals_app.services.processing import signals_process
from signals_app.validation import SignalIn
from tests.factories import PASSWORD

if TYPE_CHECKING:
    from playwright.sync_api import Page

PROJECT_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def examples(count: int) -> int:
    """How many examples a property tries: all of them in `make test`, an eighth (at least 25)
    in the fast inner loop (`make test-fast` sets TEST_FAST)."""
    return max(count // 8, 25) if os.environ.get("TEST_FAST") else count


# --- clients ------------------------------------------------------------------------------------


def logged_in(user: Any) -> Client:
    """A browser-like client with ``user``'s session (the admin and the console)."""
    client = Client()
    client.force_login(user)
    return client


def as_client(user: Any) -> APIClient:
    """An API client authenticated as ``user``."""
    client = APIClient()
    client.force_authenticate(user)
    return client


def shown_ids(response: Any) -> list[int]:
    """The primary keys an admin changelist page shows, sorted."""
    assert response.status_code == 200
    return sorted(obj.pk for obj in response.context["cl"].result_list)


def log_in(page: Page, base_url: str, username: str) -> None:
    """Through the admin's own login page, as an operator would (a Playwright page)."""
    page.goto(f"{base_url}/admin/")
    page.wait_for_url(re.compile(r"/admin/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/$"))


# --- the leave records --------------------------------------------------------------------------


def written() -> tuple[list[tuple[int, bytes]], int, int]:
    """Everything a write could touch: the records, the history and the clock."""
    records = [(u, bytes(v)) for u, v in CommunityLeave.objects.order_by("user_id").values_list("user_id", "value")]
    return records, LeaveHistory.objects.count(), LeaveClock.objects.get(pk=1).version


# --- signals through the real ingest service ----------------------------------------------------

# A whole hour well in the past, so that no signal is "in the future" and buckets are exact.
HOUR = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)


def sig(
    user_id: int,
    item_id: int = 1,
    kind: str = "view",
    weight: float = 1.0,
    at: datetime | None = None,
    key: str | None = None,
) -> SignalIn:
    return SignalIn(user_id, item_id, kind, weight, at or HOUR + timedelta(minutes=10), key)


def ingest(sender: Any, *signals: SignalIn) -> list[int]:
    """Store signals as pending through the service; returns their ids (nothing enqueued in a test)."""
    return signals_ingest(sender=sender, signals=signals).signal_ids


def join(user_id: int, *groups: Community | Cohort) -> None:
    for group in groups:
        group_members_add(group=group, user_ids=[user_id])


def backdate(ids: list[int], by: timedelta) -> None:
    """Make signals look received (and their tasks sent) ``by`` ago."""
    moment = timezone.now() - by
    Signal.objects.filter(pk__in=ids).update(received_at=moment, enqueued_at=moment)


# --- two connections at once (PostgreSQL's row locks) -------------------------------------------


def in_thread(work: Callable[[], Any]) -> threading.Thread:
    """Start ``work`` on a thread of its own: its own database connection, closed when it ends."""

    def run() -> None:
        try:
            work()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def batch_held_open(signal_ids: list[int]) -> tuple[threading.Thread, threading.Event]:
    """Process ``signal_ids`` on another connection and keep its transaction open, every lock it
    took held, until the returned event is set; returns once the batch is processed."""
    processed, release = threading.Event(), threading.Event()

    def batch() -> None:
        with transaction.atomic():
            signals_process(signal_ids=signal_ids)
            processed.set()
            release.wait(30)

    thread = in_thread(batch)
    assert processed.wait(30), "the batch did not get processed"
    return thread, release


# --- commands -----------------------------------------------------------------------------------


def run_command(*args: Any, stderr: bool = False) -> str:
    """A management command run in this process (``call_command``); what it wrote on stdout,
    followed by what it wrote on stderr when ``stderr``."""
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=out if stderr else io.StringIO())
    return out.getvalue()


def child_env() -> dict[str, str]:
    """Environment for a separate OS process that must use the test database."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        url = f"sqlite:///{db['NAME']}"
    else:
        host = db.get("HOST") or "127.0.0.1"
        port = db.get("PORT") or 5432
        user = db.get("USER") or ""
        password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
        auth = f"{user}{password}@" if user else ""
        url = f"postgres://{auth}{host}:{port}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tidalproject.settings.test"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_DIR), env.get("PYTHONPATH", "")]))
    return env


def manage(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``manage.py *args`` in a process of its own, on the test database."""
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=PROJECT_DIR,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
