"""Helpers for the signal pipeline tests: signals made through the real ingest service."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from community.models import Cohort, Community
from community.services.groups import group_members_add
from signals_app.services import ingest_signals
from signals_app.validation import SignalIn
from tests.factories import UserFactory

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
    return ingest_signals(sender=sender, signals=signals).signal_ids


@pytest.fixture
def sender(db: None) -> Any:
    """An account that may post signals."""
    return UserFactory(perms=["signals_app.add_signal"])


@pytest.fixture
def community(db: None) -> Community:
    return Community.objects.create(slug="python", name="Python")


@pytest.fixture
def community2(db: None) -> Community:
    return Community.objects.create(slug="rust", name="Rust")


@pytest.fixture
def cohort(db: None) -> Cohort:
    return Cohort.objects.create(slug="early", name="Early adopters")


def join(user_id: int, *groups: Community | Cohort) -> None:
    for group in groups:
        group_members_add(group=group, user_ids=[user_id])


def backdate(ids: list[int], by: timedelta) -> None:
    """Make signals look received (and their tasks sent) ``by`` ago."""
    from signals_app.models import Signal

    moment = timezone.now() - by
    Signal.objects.filter(pk__in=ids).update(received_at=moment, enqueued_at=moment)


@pytest.fixture
def empty_queue() -> Iterator[None]:
    """The configured broker's queue, empty before and after (no worker runs here)."""
    from tidalproject.celery import app

    app.control.purge()
    yield
    app.control.purge()


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch, empty_queue: None) -> Iterator[list[list[int]]]:
    """Records what would be sent to the broker instead of sending it.

    Only the last step, ``process_signal_batch.delay``, is replaced: the code that decides
    what to enqueue (and splits it into batches) runs for real. No worker runs in these tests,
    and the real queue stays empty, as the sweep sees it when workers keep up.
    """
    from signals_app.tasks import process_signal_batch

    calls: list[list[int]] = []
    monkeypatch.setattr(process_signal_batch, "delay", lambda ids: calls.append(list(ids)))
    yield calls
