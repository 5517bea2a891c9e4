"""The sweep: signals still pending long after receipt are enqueued again, without a storm."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tidalproject import metrics

from ..models import Outcome, Signal
from .ingest import signals_enqueue


@dataclass(frozen=True)
class SweepReport:
    enqueued: int
    # Pending past the threshold but left alone: a task sent for them earlier may still be
    # waiting in the queue behind a backlog.
    deferred: int
    queued_tasks: int | None


def pending_signals_requeue(*, older_than: timedelta, limit: int = 100_000, force: bool = False) -> SweepReport:
    """Enqueue again the signals still pending ``older_than`` after they were received.

    For a broker that lost messages. No sweep storm: a signal whose task was never sent (or
    whose send failed) is enqueued at once; one whose task was sent is enqueued again only
    when the broker's queue is empty (a backlog means that task may still be waiting in it)
    or, where the broker cannot say, once per ``older_than``. ``force`` enqueues every one of
    them regardless. Processing is idempotent, so a task that was in fact still queued is
    only skipped by the second one.
    """
    from tidalproject.celery import queued_task_count

    now = timezone.now()
    cutoff = now - older_than
    queued = None if force else queued_task_count()
    stale = Signal.objects.filter(outcome=Outcome.PENDING, received_at__lt=cutoff)
    due = Q(enqueued_at__isnull=True)
    if force:
        due |= Q(enqueued_at__isnull=False)
    elif queued is None or queued == 0:
        due |= Q(enqueued_at__lt=cutoff)
    with transaction.atomic():
        ids = list(stale.filter(due).order_by("id").values_list("id", flat=True)[:limit])
        Signal.objects.filter(id__in=ids).update(enqueued_at=now)
    deferred = stale.exclude(due).count() if queued else 0
    signals_enqueue(ids)
    metrics.SIGNALS_REQUEUED.inc(len(ids))
    return SweepReport(enqueued=len(ids), deferred=deferred, queued_tasks=queued)
