"""Erasure: a leave that also takes back the past, exactly, in one transaction, on the record.

``erase_user`` runs, all or nothing:

1. the leave clock is locked as for a leave, and ``community``'s leave core writes an
   ``erase`` history row at a new version (even when the user is already left), so every
   process's fence sees it and its cache marks the user erased;
2. the user's signals received before that version are locked ``FOR UPDATE`` (no SKIP
   LOCKED): a batch in flight that holds any of them commits first, and what it committed is
   read (attributed -> subtracted);
3. every attributed one is subtracted from every aggregate row it was credited to (the
   ``credited_*`` lists), set-based, rows falling to zero deleted, ``last_at`` recomputed
   where a removed signal may have been the last;
4. the signals are deleted and the counts written on the erase row: the receipt.

The rules for what the transaction cannot see (rows written by transactions concurrent with
it; each is tested):

- *After commit, a settle pass* repeats steps 2-4 for signals received before the erasure's
  version. It waits for any batch that locked such a row before the erasure committed and
  synced its fence before then (so it may have attributed it), and takes it back too; the
  counts are added to the same receipt before the answer is sent.
- *At processing*, a pending signal of a user who is erased and still left is deleted, not
  gated: it was received before the erasure (afterwards they are suppressed at ingest), and
  never credited, so nothing is subtracted.
- *At ingest*, a request that stored signals as gated on receipt syncs the fence again after
  its commit and deletes those of users erased meanwhile (gated rows are never processed).
- *The sweep* (beat, every ``SIGNAL_SWEEP_EVERY_SECONDS``) settles any erasure that still has
  signals received before it: the safety net for a process that died between the erasure's
  commit and its settle pass, or an erased user who rejoined before a straggler was processed.

Idempotent: erasing a user who is erased and still left, with nothing of theirs received
before that erasure, writes nothing and answers the last receipt with ``already_erased``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F, Max, Q

from community.membership import CommunityMembership, MembershipStatus
from community.models import ChangeAction, ChangeSource, LeaveClock, LeaveHistory
from community.services import erase_community_layer
from tidalproject import metrics

from .models import Signal
from .sql import take_back_signals

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErasureReceipt:
    """What an erasure did, as written on its history row (no personal content but the id)."""

    user_id: int
    version: int
    membership: CommunityMembership
    signals_removed: int
    aggregate_rows_changed: int
    already_erased: bool
    actor: str
    source: str
    at: datetime


def _receipt(entry: LeaveHistory, *, already_erased: bool) -> ErasureReceipt:
    membership = entry.membership
    assert membership is not None  # an erase row is always written with a clean record
    return ErasureReceipt(
        user_id=entry.user_id,
        version=entry.version,
        membership=membership,
        signals_removed=entry.signals_removed or 0,
        aggregate_rows_changed=entry.aggregate_rows_changed or 0,
        already_erased=already_erased,
        actor=entry.actor_label,
        source=entry.source,
        at=entry.at,
    )


def _received_before(user_id: int, version: int) -> Q:
    return Q(user_id=user_id) & (Q(fence_at_receipt__isnull=True) | Q(fence_at_receipt__lt=version))


def erase_user(*, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API) -> ErasureReceipt:
    """Erase ``user_id`` (module docstring): they leave, every past contribution of theirs is
    taken back from the aggregates and their stored signals are deleted. Returns the receipt.

    An unknown user is erased like any other: a receipt with zero counts.
    """
    with transaction.atomic():
        # The clock first, as every leave: erasures and leaves of the same user queue up here.
        LeaveClock.objects.select_for_update().get(pk=1)
        last = LeaveHistory.objects.filter(user_id=user_id).order_by("-version").first()
        if (
            last is not None
            and _erased_and_left(last)
            and not Signal.objects.filter(_received_before(user_id, last.version)).exists()
        ):
            return _receipt(last, already_erased=True)
        change = erase_community_layer(user_id=user_id, actor=actor, source=source)
        removed, rows_changed = take_back_signals(user_id, change.version)
        LeaveHistory.objects.filter(version=change.version).update(
            signals_removed=removed, aggregate_rows_changed=rows_changed
        )
    settle_erasure(user_id=user_id, version=change.version)
    entry = LeaveHistory.objects.get(version=change.version)
    transaction.on_commit(lambda: _erased(entry))
    return _receipt(entry, already_erased=False)


def _erased_and_left(entry: LeaveHistory) -> bool:
    record = entry.membership
    return entry.action == ChangeAction.ERASE and record is not None and record.status == MembershipStatus.LEFT


def _erased(entry: LeaveHistory) -> None:
    metrics.ERASURES.labels(source=entry.source).inc()
    metrics.SIGNALS_ERASED.labels(stage="erasure").inc(entry.signals_removed or 0)
    logger.info(
        "user erased",
        extra={
            "user_id": entry.user_id,
            "version": entry.version,
            "source": entry.source,
            "signals_removed": entry.signals_removed,
            "aggregate_rows_changed": entry.aggregate_rows_changed,
        },
    )


def settle_erasure(*, user_id: int, version: int) -> tuple[int, int]:
    """Take back what is left of ``user_id``'s signals received before erase ``version``
    (written by transactions concurrent with the erasure), adding the counts to its receipt.
    Idempotent; returns (signals removed, aggregate rows changed) by this call."""
    with transaction.atomic():
        removed, rows_changed = take_back_signals(user_id, version)
        if removed or rows_changed:
            LeaveHistory.objects.filter(version=version).update(
                signals_removed=F("signals_removed") + removed,
                aggregate_rows_changed=F("aggregate_rows_changed") + rows_changed,
            )
            logger.info(
                "erasure settled",
                extra={"user_id": user_id, "version": version, "signals_removed": removed},
            )
    return removed, rows_changed


def settle_erasures(*, limit: int = 10_000) -> int:
    """The sweep's safety net: settle every erasure that still has signals of its user
    received before it. Returns how many erasures had something to settle."""
    latest = (
        LeaveHistory.objects.filter(action=ChangeAction.ERASE)
        .values("user_id")
        .annotate(version=Max("version"))
        .values_list("user_id", "version")
    )
    settled = 0
    for user_id, version in latest.iterator(chunk_size=2000):
        if Signal.objects.filter(_received_before(user_id, version)).exists():
            removed, _ = settle_erasure(user_id=user_id, version=version)
            settled += 1
            metrics.SIGNALS_ERASED.labels(stage="sweep").inc(removed)
            if settled >= limit:
                break
    return settled


def erase_users(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.COMMAND
) -> list[ErasureReceipt]:
    """Erase each user in turn, each in a transaction of its own (``erase_user``)."""
    return [erase_user(user_id=user_id, actor=actor, source=source) for user_id in dict.fromkeys(user_ids)]
