"""Ingest: a batch of validated signals checked at the gate, stored, and enqueued once committed."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from community.cache import leave_gate
from community.cache.gate import LeaveGate
from tidalproject import metrics

from ..models import GatedReason, Outcome, Signal
from ..sql.ingest import insert_signals
from ..validation import SignalIn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    signal_ids: list[int]
    # Signals of users erased and still left: dropped, not stored (signals_app.erasure).
    suppressed: int = 0


def signals_ingest(*, sender: Any, signals: Sequence[SignalIn]) -> IngestResult:
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
            transaction.on_commit(partial(enqueue_after_commit, pending), robust=True)
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


def signals_enqueue(signal_ids: Sequence[int]) -> None:
    """Queue processing tasks of SIGNAL_BATCH_SIZE signals each."""
    from ..tasks import process_signal_batch

    size = settings.SIGNAL_BATCH_SIZE
    # One producer for all the tasks, its messages sent together: on Redis, one pipeline (one
    # client, one round trip) instead of one of each per task; brokers that cannot batch send
    # each at once. A failure sends none that were not flushed (the caller leaves them to the sweep).
    with process_signal_batch.app.producer_or_acquire() as producer, producer.batch():
        for start in range(0, len(signal_ids), size):
            batch = list(signal_ids[start : start + size])
            # Celery would otherwise write a repr of the ids into every message's headers (for
            # logs and monitors): a few percent of a 1,000-signal request's time; the range says enough.
            shown = f"[{len(batch)} signal ids: {batch[0]}..{batch[-1]}]"
            process_signal_batch.apply_async((batch,), argsrepr=shown, producer=producer)  # type: ignore[call-arg]


def enqueue_after_commit(signal_ids: Sequence[int]) -> None:
    # The signals are committed: 202 means stored, whatever the broker does now. Whatever
    # goes wrong sending the tasks (a broker down, a full disk under the filesystem broker,
    # a serializer error), the signals stay pending and the sweep enqueues them; they are
    # marked as never sent so the sweep takes them first.
    try:
        signals_enqueue(signal_ids)
    except Exception:
        logger.warning("could not enqueue %d stored signals: left to the sweep", len(signal_ids), exc_info=True)
        metrics.SIGNALS_ENQUEUE_FAILED.inc(len(signal_ids))
        try:
            Signal.objects.filter(id__in=signal_ids, outcome=Outcome.PENDING).update(enqueued_at=None)
        except DatabaseError:
            logger.warning("could not mark them unsent either; the sweep still finds them by age", exc_info=True)
