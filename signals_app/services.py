"""Writes of the signal pipeline: ingest, processing (the gate's home), the sweep."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from community.cache import LeaveGate
from community.models import CohortMember, CommunityLeave, CommunityMember
from tidalproject import metrics

from .models import CohortAggregate, CommunityAggregate, Outcome, Signal, hour_bucket
from .sql import Increments, add_to_aggregates, insert_signals, lock_pending, mark_outcomes, select_by_user
from .validation import SignalIn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    signal_ids: list[int]


def ingest_signals(*, sender: Any, signals: Sequence[SignalIn]) -> IngestResult:
    """Store validated signals and, once committed, enqueue the pending ones for processing.

    The gate is applied here too: a signal whose user has left when it is received is
    stored as gated at once and never queued. Processing applies the gate again, so a
    signal is gated when its user had left by the time it was received *or* processed:
    one received while the user was left stays gated even if a rejoin commits before a
    worker gets to it. A signal whose idempotency key this sender used before is a
    duplicate: not stored again.
    """
    with transaction.atomic():
        gate = CommunityLeave.objects.gate()
        rows = [
            (
                s.user_id,
                s.item_id,
                s.kind,
                s.weight,
                s.occurred_at,
                s.idempotency_key,
                Outcome.GATED if gate.is_left(s.user_id) else Outcome.PENDING,
            )
            for s in signals
        ]
        inserted = insert_signals(sender.pk, timezone.now(), rows)
        pending = [signal_id for signal_id, outcome in inserted if outcome == Outcome.PENDING]
        if pending:
            transaction.on_commit(partial(_enqueue_after_commit, pending))
        transaction.on_commit(partial(_ingested, len(inserted), len(inserted) - len(pending)))
    return IngestResult(
        accepted=len(inserted), duplicates=len(rows) - len(inserted), signal_ids=[i for i, _ in inserted]
    )


def _ingested(accepted: int, gated: int) -> None:
    metrics.SIGNALS_ACCEPTED.inc(accepted)
    if gated:
        metrics.SIGNALS_PROCESSED.labels(outcome="gated", stage="ingest").inc(gated)


def enqueue_signal_processing(signal_ids: Sequence[int]) -> None:
    """Queue processing tasks of SIGNAL_BATCH_SIZE signals each."""
    from .tasks import process_signal_batch

    size = settings.SIGNAL_BATCH_SIZE
    for start in range(0, len(signal_ids), size):
        process_signal_batch.delay(list(signal_ids[start : start + size]))


def _enqueue_after_commit(signal_ids: Sequence[int]) -> None:
    # The signals are committed: a broker that cannot be reached now is not the client's
    # problem. They stay pending and the sweep (requeue_pending_signals) enqueues them.
    from kombu.exceptions import OperationalError as BrokerError

    try:
        enqueue_signal_processing(signal_ids)
    except BrokerError:
        logger.warning("broker unreachable: %d signals left for the sweep", len(signal_ids), exc_info=True)


@dataclass(frozen=True)
class BatchReport:
    attributed: int = 0
    gated: int = 0
    no_target: int = 0

    @property
    def processed(self) -> int:
        return self.attributed + self.gated + self.no_target


def _credit(
    increments: Increments, target_ids: Sequence[int], item_id: int, kind: str, weight: float, at: datetime
) -> Outcome:
    """Add the signal to each target's (hour, item, kind) increment."""
    if not target_ids:
        return Outcome.NO_TARGET
    hour = hour_bucket(at)
    for target_id in target_ids:
        key = (target_id, hour, item_id, kind)
        current = increments.get(key)
        if current is None:
            increments[key] = [1, weight, at]
        else:
            current[0] += 1
            current[1] += weight
            if at > current[2]:
                current[2] = at
    return Outcome.ATTRIBUTED


def try_cohort_attribution(
    gate: LeaveGate,
    user_id: int,
    item_id: int,
    kind: str,
    weight: float,
    occurred_at: datetime,
    cohort_ids: Sequence[int],
    increments: Increments,
) -> Outcome:
    """Credit the signal to every cohort of its user, unless the user has left."""
    if gate.is_left(user_id):
        return Outcome.GATED
    return _credit(increments, cohort_ids, item_id, kind, weight, occurred_at)


def try_community_forwarding(
    gate: LeaveGate,
    user_id: int,
    item_id: int,
    kind: str,
    weight: float,
    occurred_at: datetime,
    community_ids: Sequence[int],
    increments: Increments,
) -> Outcome:
    """Forward the signal to every community of its user, unless the user has left."""
    if gate.is_left(user_id):
        return Outcome.GATED
    return _credit(increments, community_ids, item_id, kind, weight, occurred_at)


def _memberships(model: type[CommunityMember] | type[CohortMember], user_ids: set[int]) -> dict[int, list[int]]:
    target = "community_id" if model is CommunityMember else "cohort_id"
    by_user: dict[int, list[int]] = {}
    for user_id, target_id in select_by_user(model, target, user_ids):
        by_user.setdefault(user_id, []).append(target_id)
    return by_user


def process_signals(*, signal_ids: Sequence[int]) -> BatchReport:
    """Process the pending signals among ``signal_ids``, in one transaction.

    Locks them (skipping any another worker holds), syncs the leave fence once, loads the
    batch's memberships, runs the two gated steps for each signal, adds the increments to
    the aggregates and marks each signal with its outcome. Signals already processed are
    not touched, so running it again on the same ids changes nothing.
    """
    started = time.perf_counter()
    with transaction.atomic():
        rows = lock_pending(signal_ids)
        if not rows:
            return BatchReport()
        gate = CommunityLeave.objects.gate()
        user_ids = {row[1] for row in rows}
        cohorts = _memberships(CohortMember, user_ids)
        communities = _memberships(CommunityMember, user_ids)
        cohort_increments: Increments = {}
        community_increments: Increments = {}
        by_outcome: dict[Outcome, list[int]] = {Outcome.ATTRIBUTED: [], Outcome.GATED: [], Outcome.NO_TARGET: []}
        no_targets: Sequence[int] = ()
        for signal_id, user_id, item_id, kind, weight, occurred_at, _ in rows:
            attributed = try_cohort_attribution(
                gate, user_id, item_id, kind, weight, occurred_at, cohorts.get(user_id, no_targets), cohort_increments
            )
            forwarded = try_community_forwarding(
                gate,
                user_id,
                item_id,
                kind,
                weight,
                occurred_at,
                communities.get(user_id, no_targets),
                community_increments,
            )
            by_outcome[min(attributed, forwarded, key=_OUTCOME_RANK.__getitem__)].append(signal_id)
        add_to_aggregates(CohortAggregate, cohort_increments)
        add_to_aggregates(CommunityAggregate, community_increments)
        now = timezone.now()
        mark_outcomes({int(outcome): ids for outcome, ids in by_outcome.items()}, now)
        report = BatchReport(
            attributed=len(by_outcome[Outcome.ATTRIBUTED]),
            gated=len(by_outcome[Outcome.GATED]),
            no_target=len(by_outcome[Outcome.NO_TARGET]),
        )
        age = (now - min(row[6] for row in rows)).total_seconds()
        transaction.on_commit(partial(_processed, report, time.perf_counter() - started, age))
    return report


def _processed(report: BatchReport, seconds: float, age: float) -> None:
    for outcome in ("attributed", "gated", "no_target"):
        if count := getattr(report, outcome):
            metrics.SIGNALS_PROCESSED.labels(outcome=outcome, stage="worker").inc(count)
    metrics.BATCH_SECONDS.observe(seconds)
    metrics.SIGNAL_AGE_SECONDS.observe(age)
    logger.info(
        "signal batch processed",
        extra={
            "attributed": report.attributed,
            "gated": report.gated,
            "no_target": report.no_target,
            "seconds": seconds,
        },
    )


# A signal's outcome is the strongest of its two steps': gated, then attributed, then none.
_OUTCOME_RANK = {Outcome.GATED: 0, Outcome.ATTRIBUTED: 1, Outcome.NO_TARGET: 2}


def requeue_pending_signals(*, older_than: timedelta, limit: int = 100_000) -> int:
    """Enqueue again the signals still pending ``older_than`` after they were received.

    For a broker that lost messages: processing is idempotent, so a signal that was in fact
    still queued is only skipped by the second task. Returns how many were enqueued.
    """
    cutoff = timezone.now() - older_than
    ids = list(
        Signal.objects.filter(outcome=Outcome.PENDING, received_at__lt=cutoff)
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )
    enqueue_signal_processing(ids)
    return len(ids)
