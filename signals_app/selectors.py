"""Reads of the signal pipeline: trending, attribution, a user's signals, outcome counts."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from community.models import Cohort, Community

from .models import CohortAggregate, CommunityAggregate, Outcome, Signal


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
        queryset = queryset.filter(hour__gte=since.replace(minute=0, second=0, microsecond=0))
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
