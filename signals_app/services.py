"""Writes of the signal pipeline: ingest, processing (the gate's home), the sweep."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import Q
from django.utils import timezone

from community.cache import leave_gate
from community.cache.gate import LeaveGate
from tidalproject import metrics

from .models import GatedReason, Outcome, Signal
from .sql import credit_and_mark, insert_signals, lock_pending
from .validation import SignalIn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    signal_ids: list[int]
    # Signals of users erased and still left: dropped, not stored (signals_app.erasure).
    suppressed: int = 0


def ingest_signals(*, sender: Any, signals: Sequence[SignalIn]) -> IngestResult:
    """Store validated signals and, once committed, enqueue the pending ones for processing.

    The gate is checked here, on receipt, and the fence version of that check is stored with
    every signal: a signal whose user has left is stored as gated (left at receipt, or a
    corrupt record) and never queued. Processing checks again and also looks at every change
    in between, so a signal is attributed only if its user was active all along. A signal
    whose idempotency key this sender used before is a duplicate: not stored again. A signal
    of a user who is erased and still left is not stored at all: counted as suppressed.
    """
    with transaction.atomic():
        gate = leave_gate()
        kept = [s for s in signals if not gate.is_erased(s.user_id)]
        rows = [
            (s.user_id, s.item_id, s.kind, s.weight, s.occurred_at, s.idempotency_key, *_receipt(gate, s.user_id))
            for s in kept
        ]
        inserted = insert_signals(sender.pk, timezone.now(), gate.version, rows) if rows else []
        pending = [signal_id for signal_id, outcome in inserted if outcome == Outcome.PENDING]
        if pending:
            transaction.on_commit(partial(_enqueue_after_commit, pending), robust=True)
        suppressed = len(signals) - len(kept)
        transaction.on_commit(partial(_ingested, len(inserted), len(inserted) - len(pending), suppressed))
        if len(pending) < len(inserted):
            gated_ids = [signal_id for signal_id, outcome in inserted if outcome != Outcome.PENDING]
            gated_users = {row[0] for row in rows if row[6] != Outcome.PENDING}
            transaction.on_commit(partial(_drop_if_erased_meanwhile, gated_ids, gated_users), robust=True)
    return IngestResult(
        accepted=len(inserted),
        duplicates=len(rows) - len(inserted),
        signal_ids=[i for i, _ in inserted],
        suppressed=suppressed,
    )


def _drop_if_erased_meanwhile(signal_ids: list[int], user_ids: set[int]) -> None:
    """Signals stored gated on receipt are never processed: if their user was erased by a
    transaction concurrent with this ingest (which could not see these rows), delete them
    now. Either that erasure committed first, and this sync sees it, or it commits later,
    and its settle pass sees these rows. A failure here is left to the sweep."""
    try:
        gate = leave_gate()
        erased = [user_id for user_id in user_ids if gate.is_erased(user_id)]
        if erased:
            dropped, _ = Signal.objects.filter(id__in=signal_ids, user_id__in=erased).delete()
            metrics.SIGNALS_ERASED.labels(stage="ingest").inc(dropped)
    except DatabaseError:
        logger.warning("could not check %d gated signals against erasures: left to the sweep", len(signal_ids))


def _receipt(gate: LeaveGate, user_id: int) -> tuple[Outcome, GatedReason | None]:
    if not gate.is_left(user_id):
        return Outcome.PENDING, None
    return Outcome.GATED, GatedReason.CORRUPT_RECORD if gate.is_corrupt(user_id) else GatedReason.LEFT_AT_RECEIPT


def _ingested(accepted: int, gated: int, suppressed: int = 0) -> None:
    metrics.SIGNALS_ACCEPTED.inc(accepted)
    if suppressed:
        metrics.SIGNALS_SUPPRESSED.inc(suppressed)
    if gated:
        metrics.SIGNALS_PROCESSED.labels(outcome="gated", stage="ingest").inc(gated)


def enqueue_signal_processing(signal_ids: Sequence[int]) -> None:
    """Queue processing tasks of SIGNAL_BATCH_SIZE signals each."""
    from .tasks import process_signal_batch

    size = settings.SIGNAL_BATCH_SIZE
    for start in range(0, len(signal_ids), size):
        batch = list(signal_ids[start : start + size])
        # Celery would otherwise write a repr of the ids into every message's headers (for
        # logs and monitors): a few percent of a 1,000-signal request's time; the range says enough.
        shown = f"[{len(batch)} signal ids: {batch[0]}..{batch[-1]}]"
        process_signal_batch.apply_async((batch,), argsrepr=shown)  # type: ignore[call-arg]  # not in the stubs


def _enqueue_after_commit(signal_ids: Sequence[int]) -> None:
    # The signals are committed: 202 means stored, whatever the broker does now. Whatever
    # goes wrong sending the tasks (a broker down, a full disk under the filesystem broker,
    # a serializer error), the signals stay pending and the sweep enqueues them; they are
    # marked as never sent so the sweep takes them first.
    try:
        enqueue_signal_processing(signal_ids)
    except Exception:
        logger.warning("could not enqueue %d stored signals: left to the sweep", len(signal_ids), exc_info=True)
        metrics.SIGNALS_ENQUEUE_FAILED.inc(len(signal_ids))
        try:
            Signal.objects.filter(id__in=signal_ids, outcome=Outcome.PENDING).update(enqueued_at=None)
        except DatabaseError:
            logger.warning("could not mark them unsent either; the sweep still finds them by age", exc_info=True)


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


class Queued(NamedTuple):
    """A locked pending signal, as the gate sees it."""

    id: int
    user_id: int
    since: int  # its receipt fence (the processing fence for signals stored before fences)


def try_cohort_attribution(gate: LeaveGate, batch: Sequence[Queued]) -> list[int]:
    """The seed's step, for a whole batch: the gate at its top, then the signals whose users
    were active all along (at every fence version from receipt to now), to be credited to
    every cohort of their user by ``credit_and_mark`` in one set-based statement."""
    return [signal.id for signal in batch if not gate.is_left(signal.user_id, since=signal.since)]


def try_community_forwarding(gate: LeaveGate, batch: Sequence[Queued]) -> list[int]:
    """The seed's step, for a whole batch: the gate at its top, then the signals to forward
    to every community of their user (``credit_and_mark``)."""
    return [signal.id for signal in batch if not gate.is_left(signal.user_id, since=signal.since)]


def _gated_reason(gate: LeaveGate, user_id: int) -> GatedReason:
    if gate.is_corrupt(user_id):
        return GatedReason.CORRUPT_RECORD
    return GatedReason.LEFT_AT_PROCESSING if gate.is_left(user_id) else GatedReason.LEFT_WHILE_QUEUED


def process_signals(*, signal_ids: Sequence[int]) -> BatchReport:
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
        batch = [Queued(signal_id, user_id, fence if since is None else since) for signal_id, user_id, _, since in rows]
        earliest: dict[int, int] = {}
        for signal in batch:
            earliest[signal.user_id] = min(signal.since, earliest.get(signal.user_id, signal.since))
        gate.preload(earliest)
        to_cohorts = try_cohort_attribution(gate, batch)
        to_communities = try_community_forwarding(gate, batch)
        passed = set(to_cohorts) | set(to_communities)
        # Received before an erasure of its user (afterwards they are suppressed at ingest),
        # never credited: deleted, nothing to subtract.
        erased = [s.id for s in batch if s.id not in passed and gate.is_erased(s.user_id)]
        dropped = set(erased)
        reasons = {
            s.id: None if s.id in passed else _gated_reason(gate, s.user_id) for s in batch if s.id not in dropped
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
        age = (now - min(row[2] for row in rows)).total_seconds()
        transaction.on_commit(partial(_processed, report, gated_labels, time.perf_counter() - started, age))
    return report


# Errors that a retry may cure: the database went away, a deadlock, a serialization failure,
# the fence unreadable. Anything else is a property of the signals themselves.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def process_signals_isolating_failures(*, signal_ids: Sequence[int]) -> BatchReport:
    """``process_signals``, but a batch that fails for a reason other than a transient
    database error is split in halves until the failing signals stand alone: the rest go
    through, and each failing signal is marked failed with its error, out of the sweep's way.
    Transient errors propagate, for the task to retry the whole batch."""
    try:
        return process_signals(signal_ids=signal_ids)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - isolating whatever the signals themselves cause
        if len(signal_ids) == 1:
            return _mark_failed(signal_ids[0], exc)
        logger.warning("signal batch of %d failed (%s): isolating the failing signals", len(signal_ids), exc)
        middle = len(signal_ids) // 2
        return process_signals_isolating_failures(signal_ids=signal_ids[:middle]) + process_signals_isolating_failures(
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


def retry_failed_signals(*, signal_ids: Sequence[int] | None = None) -> int:
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
        transaction.on_commit(partial(_enqueue_after_commit, ids), robust=True)
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


@dataclass(frozen=True)
class SweepReport:
    enqueued: int
    # Pending past the threshold but left alone: a task sent for them earlier may still be
    # waiting in the queue behind a backlog.
    deferred: int
    queued_tasks: int | None


def requeue_pending_signals(*, older_than: timedelta, limit: int = 100_000, force: bool = False) -> SweepReport:
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
    enqueue_signal_processing(ids)
    metrics.SIGNALS_REQUEUED.inc(len(ids))
    return SweepReport(enqueued=len(ids), deferred=deferred, queued_tasks=queued)
