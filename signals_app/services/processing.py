"""Processing: a batch locked, gated at the top of the seed's two steps, credited and marked
in one statement; a failing batch bisected down to its failing signals."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from functools import partial

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from community.cache import leave_gate
from community.cache.gate import LeaveGate
from tidalproject import metrics

from ..models import GatedReason, Outcome, Signal
from ..sql.credit import credit_and_mark, lock_pending
from .ingest import enqueue_after_commit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchReport:
    attributed: int = 0
    gated: int = 0
    no_target: int = 0
    failed: int = 0
    # Deleted: received before an erasure of their user, who is still left (signals_app.erasure).
    erased: int = 0

    @property
    def processed(self) -> int:
        return self.attributed + self.gated + self.no_target + self.failed + self.erased

    def __add__(self, other: BatchReport) -> BatchReport:
        return BatchReport(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class Queued:
    """The locked pending signals of a batch, as the gate sees them: columns, by id."""

    ids: list[int]
    user_ids: list[int]
    since: list[int]  # each one's receipt fence (the processing fence for signals stored before fences)

    @classmethod
    def locked(cls, rows: Sequence[tuple[int, int, float, int | None]], fence: int) -> Queued:
        ids, user_ids, _, since = zip(*rows, strict=True) if rows else ((), (), (), ())
        return cls(list(ids), list(user_ids), [fence if version is None else version for version in since])


def try_cohort_attribution(gate: LeaveGate, batch: Queued) -> list[int]:
    """The seed's step, for a whole batch: the gate at its top, then the signals whose users
    were active all along (at every fence version from receipt to now), to be credited to
    every cohort of their user by ``credit_and_mark`` in one set-based statement."""
    return _passing(gate, batch)


def try_community_forwarding(gate: LeaveGate, batch: Queued) -> list[int]:
    """The seed's step, for a whole batch: the gate at its top, then the signals to forward
    to every community of their user (``credit_and_mark``)."""
    return _passing(gate, batch)


def _passing(gate: LeaveGate, batch: Queued) -> list[int]:
    """The ids of the signals whose users the gate lets through, the batch's users gated at once."""
    left = gate.left_among(batch.user_ids, batch.since)
    return [signal_id for signal_id, gated in zip(batch.ids, left, strict=True) if not gated]


def _gated_reason(gate: LeaveGate, user_id: int) -> GatedReason:
    if gate.is_corrupt(user_id):
        return GatedReason.CORRUPT_RECORD
    return GatedReason.LEFT_AT_PROCESSING if gate.is_left(user_id) else GatedReason.LEFT_WHILE_QUEUED


def signals_process(*, signal_ids: Sequence[int]) -> BatchReport:
    """Process the pending signals among ``signal_ids``, in one transaction.

    Locks them (skipping any another worker holds), syncs the leave fence once, gates the
    batch in memory (a signal is gated when its user was left at any fence version from its
    receipt check to this one, so the outcome does not depend on when a worker got to it),
    then credits the aggregates, writes each signal's outcome and evidence (this fence
    version, why it was gated, where it was credited) in as few statements as the database
    allows (``credit_and_mark``). Signals already processed are not touched, so running it
    again on the same ids changes nothing.
    """
    started = time.perf_counter()
    with transaction.atomic():
        rows = lock_pending(signal_ids)
        if not rows:
            return BatchReport()
        gate = leave_gate()
        fence = gate.version
        batch = Queued.locked(rows, fence)
        earliest: dict[int, int] = {}
        for user_id, since in zip(batch.user_ids, batch.since, strict=True):
            earliest[user_id] = min(since, earliest.get(user_id, since))
        gate.preload(earliest)
        to_cohorts = try_cohort_attribution(gate, batch)
        to_communities = try_community_forwarding(gate, batch)
        passed = set(to_cohorts) | set(to_communities)
        signals = list(zip(batch.ids, batch.user_ids, strict=True))
        # Received before an erasure of its user (afterwards they are suppressed at ingest),
        # never credited: deleted, nothing to subtract.
        erased = [signal_id for signal_id, user_id in signals if signal_id not in passed and gate.is_erased(user_id)]
        dropped = set(erased)
        reasons = {
            signal_id: None if signal_id in passed else _gated_reason(gate, user_id)
            for signal_id, user_id in signals
            if signal_id not in dropped
        }
        now = timezone.now()
        counts = credit_and_mark(
            cohorts=to_cohorts, communities=to_communities, reasons=reasons, processed_at=now, fence=fence
        )
        if erased:
            Signal.objects.filter(id__in=erased).delete()
        report = BatchReport(
            attributed=counts.get(Outcome.ATTRIBUTED, 0),
            gated=counts.get(Outcome.GATED, 0),
            no_target=counts.get(Outcome.NO_TARGET, 0),
            erased=len(erased),
        )
        gated_labels = [reason.label for reason in reasons.values() if reason is not None]
        age = now.timestamp() - min(row[2] for row in rows)
        transaction.on_commit(partial(_processed, report, gated_labels, time.perf_counter() - started, age))
    return report


# Errors that a retry may cure: the database went away, a deadlock, a serialization failure,
# the fence unreadable. Anything else is a property of the signals themselves.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def signals_process_isolating_failures(*, signal_ids: Sequence[int]) -> BatchReport:
    """``signals_process``, but a batch that fails for a reason other than a transient
    database error is split in halves until the failing signals stand alone: the rest go
    through, and each failing signal is marked failed with its error, out of the sweep's way.
    Transient errors propagate, for the task to retry the whole batch."""
    try:
        return signals_process(signal_ids=signal_ids)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - isolating whatever the signals themselves cause
        if len(signal_ids) == 1:
            return _mark_failed(signal_ids[0], exc)
        logger.warning("signal batch of %d failed (%s): isolating the failing signals", len(signal_ids), exc)
        middle = len(signal_ids) // 2
        return signals_process_isolating_failures(signal_ids=signal_ids[:middle]) + signals_process_isolating_failures(
            signal_ids=signal_ids[middle:]
        )


def _mark_failed(signal_id: int, exc: Exception) -> BatchReport:
    error = f"{type(exc).__name__}: {exc}"[:2000]
    failed = Signal.objects.filter(id=signal_id, outcome=Outcome.PENDING).update(
        outcome=Outcome.FAILED, error=error, processed_at=timezone.now()
    )
    if failed:
        logger.error("signal %d failed: %s", signal_id, error)
        metrics.SIGNALS_PROCESSED.labels(outcome="failed", stage="worker").inc()
    return BatchReport(failed=failed)


def failed_signals_retry(*, signal_ids: Sequence[int] | None = None) -> int:
    """Put failed signals (all, or those among ``signal_ids``) back to pending and enqueue
    them: for after the cause is fixed. Returns how many."""
    failed = Signal.objects.filter(outcome=Outcome.FAILED)
    if signal_ids is not None:
        failed = failed.filter(id__in=signal_ids)
    with transaction.atomic():
        ids = list(failed.select_for_update().order_by("id").values_list("id", flat=True))
        Signal.objects.filter(id__in=ids).update(
            outcome=Outcome.PENDING, error="", processed_at=None, enqueued_at=timezone.now()
        )
        transaction.on_commit(partial(enqueue_after_commit, ids), robust=True)
    return len(ids)


def _processed(report: BatchReport, reasons: list[str], seconds: float, age: float) -> None:
    for outcome in ("attributed", "gated", "no_target"):
        if count := getattr(report, outcome):
            metrics.SIGNALS_PROCESSED.labels(outcome=outcome, stage="worker").inc(count)
    if report.erased:
        metrics.SIGNALS_ERASED.labels(stage="worker").inc(report.erased)
    for reason in reasons:
        metrics.SIGNALS_GATED.labels(reason=reason).inc()
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
