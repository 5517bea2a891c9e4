"""Reads of the signal pipeline: trending, attribution, a user's signals, outcome counts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models import Count, Max, Q, QuerySet, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from community.models import Cohort, Community

from .models import CohortAggregate, CommunityAggregate, Outcome, Signal, hour_bucket


def _top_items(
    queryset: QuerySet[Any], *, kind: str | None, since: datetime | None, until: datetime | None, limit: int
) -> list[dict[str, Any]]:
    """Sum the hour buckets in the window per item and kind, heaviest first.

    The window is in whole hours: a bucket counts when its hour starts in
    [since rounded down to the hour, until).
    """
    if kind:
        queryset = queryset.filter(kind=kind)
    if since:
        queryset = queryset.filter(hour__gte=hour_bucket(since))
    if until:
        queryset = queryset.filter(hour__lt=until)
    return list(
        queryset.values("item_id", "kind")
        .annotate(count=Sum("count"), weight_sum=Sum("weight_sum"), last_at=Max("last_at"))
        .order_by("-weight_sum", "-count", "item_id", "kind")[:limit]
    )


def community_trending(
    *,
    community: Community,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 20,
) -> list[dict[str, Any]]:
    return _top_items(
        CommunityAggregate.objects.filter(community=community), kind=kind, since=since, until=until, limit=limit
    )


def cohort_attribution(
    *,
    cohort: Cohort,
    kind: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 20,
) -> list[dict[str, Any]]:
    return _top_items(CohortAggregate.objects.filter(cohort=cohort), kind=kind, since=since, until=until, limit=limit)


def user_recent_signals(*, user_id: int) -> QuerySet[Signal]:
    return Signal.objects.filter(user_id=user_id).order_by("-id")


def outcome_summary(*, now: datetime | None = None) -> dict[str, dict[str, int]]:
    """Signals by outcome over the last hour and the last day (pending: by time received)."""
    now = now or timezone.now()
    summary: dict[str, dict[str, int]] = {}
    for label, span in (("last_hour", timedelta(hours=1)), ("last_day", timedelta(days=1))):
        since = now - span
        counts = Signal.objects.filter(outcome__gt=Outcome.PENDING, processed_at__gte=since).aggregate(
            **{o.label: Count("id", filter=Q(outcome=o)) for o in Outcome if o != Outcome.PENDING}
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
    pending ones in the hour they were received. Two grouped queries, on the
    (outcome, processed_at) index and the partial index of pending signals.
    """
    current = timezone.localtime(now or timezone.now()).replace(minute=0, second=0, microsecond=0)
    first = current - timedelta(hours=hours - 1)
    counts: dict[tuple[datetime, str], int] = {}
    processed = (
        Signal.objects.filter(outcome__gt=Outcome.PENDING, processed_at__gte=first)
        .annotate(hour=TruncHour("processed_at"))
        .values("hour", "outcome")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in processed:
        counts[row["hour"], Outcome(row["outcome"]).label] = row["n"]
    pending = (
        Signal.objects.filter(outcome=Outcome.PENDING, received_at__gte=first)
        .annotate(hour=TruncHour("received_at"))
        .values("hour")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in pending:
        counts[row["hour"], Outcome.PENDING.label] = row["n"]
    hours_shown = [first + timedelta(hours=offset) for offset in range(hours)]
    return [HourOutcomes(hour, {o.label: counts.get((hour, o.label), 0) for o in Outcome}) for hour in hours_shown]


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
