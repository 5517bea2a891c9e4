"""Reads of the signal pipeline: trending, attribution, a user's signals, outcome counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from django.db import connections
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from community.groups import MemberGroup

from .models import Outcome, Signal, hour_bucket

# The window of trending and attribution when a request gives no ``since``: a request never
# sums a target's whole history (one row per item, kind and hour since it was created).
DEFAULT_WINDOW = timedelta(hours=24)
EARLIEST = datetime.min.replace(tzinfo=UTC)

# The outcomes of processed signals: counted per outcome with "IN", so that the
# (outcome, processed_at) index is entered once per outcome at the window's start, where
# "outcome > 0" would read every processed signal's index entry to filter on the time.
PROCESSED = [o.value for o in Outcome if o != Outcome.PENDING]


def top_items(
    group_class: type[MemberGroup],
    *,
    group: MemberGroup | int,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 20,
) -> list[dict[str, Any]]:
    """A group's top items (a community's trending, a cohort's attribution): the hour buckets
    of the group class's aggregates in the window, summed per item and kind, heaviest first.

    The window is in whole hours: a bucket counts when its hour starts in
    [since rounded down to the hour, until). Without ``since`` it starts ``DEFAULT_WINDOW``
    before ``until`` (or now).
    """
    aggregates = group_class.aggregate_model
    queryset = aggregates._default_manager.filter(**{aggregates.group_field: group})
    if kind:
        queryset = queryset.filter(kind=kind)
    if since is None:
        # At most DEFAULT_WINDOW, and never before the first representable hour.
        since = max(until or timezone.now(), EARLIEST + DEFAULT_WINDOW) - DEFAULT_WINDOW
    queryset = queryset.filter(hour__gte=hour_bucket(since))
    if until:
        queryset = queryset.filter(hour__lt=until)
    return list(
        queryset.values("item_id", "kind")
        .annotate(count=Sum("count"), weight_sum=Sum("weight_sum"), last_at=Max("last_at"))
        .order_by("-weight_sum", "-count", "item_id", "kind")[:limit]
    )


def user_recent_signals(*, user_id: int) -> QuerySet[Signal]:
    return Signal.objects.filter(user_id=user_id).order_by("-id")


def outcome_summary(*, now: datetime | None = None) -> dict[str, dict[str, int]]:
    """Signals by outcome over the last hour and the last day (pending: by time received)."""
    now = now or timezone.now()
    summary: dict[str, dict[str, int]] = {}
    for label, span in (("last_hour", timedelta(hours=1)), ("last_day", timedelta(days=1))):
        since = now - span
        counts = Signal.objects.filter(outcome__in=PROCESSED, processed_at__gte=since).aggregate(
            # COUNT(outcome), not COUNT(id): the index holds outcome and processed_at, not id,
            # and answers on its own (an index-only scan).
            **{o.label: Count("outcome", filter=Q(outcome=o)) for o in Outcome if o != Outcome.PENDING}
        )
        counts["pending"] = Signal.objects.filter(outcome=Outcome.PENDING, received_at__gte=since).count()
        summary[label] = counts
    return summary


class HourOutcomes(NamedTuple):
    hour: datetime
    counts: dict[str, int]  # by outcome label, every outcome present


def outcomes_per_hour(*, hours: int = 24, now: datetime | None = None) -> list[HourOutcomes]:
    """Signals by outcome per hour, oldest first, the current (partial) hour last.

    As in ``outcome_summary``: processed signals count in the hour they were processed,
    pending ones in the hour they were received. Processed ones are counted one hour at a
    time, each a range of the (outcome, processed_at) index read on its own (an index-only
    scan, no per-row work): grouping a day of signals by their truncated hour costs about
    three times as much. Pending ones (few, on the partial index) in one grouped query.
    """
    current = timezone.localtime(now or timezone.now()).replace(minute=0, second=0, microsecond=0)
    first = current - timedelta(hours=hours - 1)
    hours_shown = [first + timedelta(hours=offset) for offset in range(hours)]
    pending_rows = (
        Signal.objects.filter(outcome=Outcome.PENDING, received_at__gte=first)
        .annotate(hour=TruncHour("received_at"))
        .values("hour")
        .annotate(n=Count("*"))
        .order_by()
    )
    pending = {row["hour"]: row["n"] for row in pending_rows}
    shown: list[HourOutcomes] = []
    for hour in hours_shown:
        counts = Signal.objects.filter(
            outcome__in=PROCESSED, processed_at__gte=hour, processed_at__lt=hour + timedelta(hours=1)
        ).aggregate(**{o.label: Count("outcome", filter=Q(outcome=o)) for o in Outcome if o != Outcome.PENDING})
        counts[Outcome.PENDING.label] = pending.get(hour, 0)
        shown.append(HourOutcomes(hour, {o.label: counts[o.label] for o in Outcome}))
    return shown


# The most kinds a filter offers.
KINDS_LISTED = 100


def signal_kinds() -> list[str]:
    """The distinct kinds of the stored signals, in order, at most ``KINDS_LISTED``.

    A loose index scan of the (kind, id) index: one index descent per kind (the next kind
    after the last one found), where ``SELECT DISTINCT kind`` reads every signal.
    """
    table = Signal._meta.db_table  # the model's own name, never input
    sql = f"""
        WITH RECURSIVE kinds(kind) AS (
            SELECT (SELECT kind FROM {table} ORDER BY kind LIMIT 1)
            UNION ALL
            SELECT (SELECT s.kind FROM {table} s WHERE s.kind > kinds.kind ORDER BY s.kind LIMIT 1)
            FROM kinds WHERE kinds.kind IS NOT NULL
        )
        SELECT kind FROM kinds WHERE kind IS NOT NULL LIMIT %s
    """  # noqa: S608
    with connections[Signal.objects.db].cursor() as cursor:
        cursor.execute(sql, [KINDS_LISTED])
        return [row[0] for row in cursor.fetchall()]


def erasure_job_progress(*, job_id: int) -> Any:
    """A bulk erasure with its counts of users done, failed and pending (404 if unknown)."""
    from django.db.models import Count, Q
    from django.shortcuts import get_object_or_404

    from .models import ErasureJob, ErasureJobUser

    done, failed, pending = ErasureJobUser.State.DONE, ErasureJobUser.State.FAILED, ErasureJobUser.State.PENDING
    jobs = ErasureJob.objects.annotate(
        done=Count("users", filter=Q(users__state=done)),
        failed=Count("users", filter=Q(users__state=failed)),
        pending=Count("users", filter=Q(users__state=pending)),
    )
    return get_object_or_404(jobs, pk=job_id)
