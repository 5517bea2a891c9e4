"""Fixtures for the signal pipeline tests: a sender, communities and a cohort, the queue.

Signals are made with ``tests.helpers`` (``sig``, ``ingest``, ``join``, ``backdate``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from community.models import Cohort, Community
from tests.factories import UserFactory


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

    Only the last step, ``process_signal_batch.apply_async``, is replaced: the code that decides
    what to enqueue (and splits it into batches) runs for real. No worker runs in these tests,
    and the real queue stays empty, as the sweep sees it when workers keep up.
    """
    from signals_app.tasks import process_signal_batch

    calls: list[list[int]] = []
    monkeypatch.setattr(process_signal_batch, "apply_async", lambda args, **_: calls.append(list(args[0])))
    yield calls
