"""Erasure: a leave that also takes back the past, exactly, in one transaction, on the record.

``user_erase`` runs, all or nothing:

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F, Max, Q

from community.membership import CommunityMembership, MembershipStatus
from community.models import ChangeAction, ChangeSource, LeaveClock, LeaveHistory
from community.services.layer import erase_community_layer
from tidalproject import metrics

from .models import Signal
from .sql.take_back import take_back_signals

logger = logging.getLogger(__name__)

# Errors that a retry may cure (as for the pipeline): a bulk job's task retries on them.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


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


def user_erase(
    *,
    user_id: int,
    actor: Any = None,
    source: ChangeSource = ChangeSource.API,
    recorded: Callable[[ErasureReceipt], None] | None = None,
) -> ErasureReceipt:
    """Erase ``user_id`` (module docstring): they leave, every past contribution of theirs is
    taken back from the aggregates and their stored signals are deleted. Returns the receipt.

    An unknown user is erased like any other: a receipt with zero counts. ``recorded`` is
    called with the receipt inside the erasure's transaction (a bulk job records its result
    there: committed with the erasure, or not at all); the settle pass may add to the counts.
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
            already = _receipt(last, already_erased=True)
            if recorded is not None:
                recorded(already)
            return already
        change = erase_community_layer(user_id=user_id, actor=actor, source=source)
        removed, rows_changed = take_back_signals(user_id, change.version)
        LeaveHistory.objects.filter(version=change.version).update(
            signals_removed=removed, aggregate_rows_changed=rows_changed
        )
        if recorded is not None:
            recorded(_receipt(LeaveHistory.objects.get(version=change.version), already_erased=False))
    erasure_settle(user_id=user_id, version=change.version)
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


def erasure_settle(*, user_id: int, version: int) -> tuple[int, int]:
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


def erasures_settle(*, limit: int = 10_000) -> int:
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
            removed, _ = erasure_settle(user_id=user_id, version=version)
            settled += 1
            metrics.SIGNALS_ERASED.labels(stage="sweep").inc(removed)
            if settled >= limit:
                break
    return settled


def users_erase(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.COMMAND
) -> list[ErasureReceipt]:
    """Erase each user in turn, each in a transaction of its own (``user_erase``)."""
    return [user_erase(user_id=user_id, actor=actor, source=source) for user_id in dict.fromkeys(user_ids)]


# --- bulk erasure -------------------------------------------------------------------------------


def erasure_job_create(*, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.API) -> Any:
    """Record a bulk erasure of ``user_ids`` (repeats dropped, order kept) and send its task
    once committed. Returns the job."""
    from .models import ErasureJob, ErasureJobUser

    ids = list(dict.fromkeys(user_ids))
    authenticated = actor is not None and actor.is_authenticated
    with transaction.atomic():
        job = ErasureJob.objects.create(
            created_by=actor if authenticated else None,
            created_by_label=actor.get_username() if authenticated else "",
            source=source,
            total=len(ids),
        )
        ErasureJobUser.objects.bulk_create(
            [ErasureJobUser(job=job, position=i, user_id=u) for i, u in enumerate(ids)], batch_size=2000
        )
        transaction.on_commit(lambda: _kick(job.pk), robust=True)
    return job


def _kick(job_id: int) -> None:
    from .tasks import run_erasure_job

    try:
        run_erasure_job.delay(job_id)
    except Exception:
        logger.warning("could not send erasure job %d: left to the sweep", job_id, exc_info=True)


def erasure_job_run(*, job_id: int) -> Any:
    """Erase the job's users still pending, one by one, each in its own transaction, and
    record each result in that transaction. Safe to run again (a task delivered twice, a
    worker killed): users done are skipped, and a user erased by someone else meanwhile is
    reported as already erased."""
    from django.utils import timezone

    from .models import ErasureJob, ErasureJobUser

    job = ErasureJob.objects.select_related("created_by").get(pk=job_id)
    if job.state == ErasureJob.State.DONE:
        return job
    ErasureJob.objects.filter(pk=job.pk).update(
        state=ErasureJob.State.RUNNING, started_at=job.started_at or timezone.now(), kicked_at=timezone.now()
    )
    pending = ErasureJobUser.objects.filter(job=job, state=ErasureJobUser.State.PENDING).order_by("position")
    for entry in list(pending.only("id", "user_id")):

        def record(receipt: ErasureReceipt, pk: int = entry.pk) -> None:
            ErasureJobUser.objects.filter(pk=pk).update(
                state=ErasureJobUser.State.DONE,
                version=receipt.version,
                signals_removed=receipt.signals_removed,
                aggregate_rows_changed=receipt.aggregate_rows_changed,
                already_erased=receipt.already_erased,
                finished_at=timezone.now(),
            )

        try:
            receipt = user_erase(
                user_id=entry.user_id, actor=job.created_by, source=ChangeSource(job.source), recorded=record
            )
        except TRANSIENT_ERRORS:
            raise  # the task retries; what is done stays done
        except Exception as exc:
            logger.exception("erasure of user %d in job %d failed", entry.user_id, job.pk)
            ErasureJobUser.objects.filter(pk=entry.pk).update(
                state=ErasureJobUser.State.FAILED,
                error=f"{type(exc).__name__}: {exc}"[:2000],
                finished_at=timezone.now(),
            )
            continue
        record(receipt)  # again, with what the settle pass added
        ErasureJob.objects.filter(pk=job.pk).update(kicked_at=timezone.now())  # the job's heartbeat
    ErasureJob.objects.filter(pk=job.pk).update(state=ErasureJob.State.DONE, finished_at=timezone.now())
    job.refresh_from_db()
    return job


def stalled_erasure_jobs_restart(*, older_than: timedelta) -> int:
    """Send again the task of every unfinished job not heard of for ``older_than`` (its
    worker died, or the broker lost the message). Returns how many."""
    from django.utils import timezone

    from .models import ErasureJob

    stalled = list(
        ErasureJob.objects.exclude(state=ErasureJob.State.DONE)
        .filter(kicked_at__lt=timezone.now() - older_than)
        .values_list("id", flat=True)
    )
    for job_id in stalled:
        ErasureJob.objects.filter(pk=job_id).update(kicked_at=timezone.now())
        _kick(job_id)
    return len(stalled)
