"""How far behind each webhook subscriber is: for the admin, the API and /metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ..models import LeaveClock, LeaveHistory, WebhookSubscription

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubscriptionLag:
    versions: int
    seconds: float


def webhook_lag(subscription: WebhookSubscription, *, clock_version: int | None = None) -> SubscriptionLag:
    """How far a subscriber is behind: changes past its cursor, and the age of the oldest."""
    version = clock_version
    if version is None:
        version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    behind = max(0, version - subscription.acked_version)
    if not behind:
        return SubscriptionLag(0, 0.0)
    oldest = (
        LeaveHistory.objects.filter(version__gt=subscription.acked_version)
        .order_by("version")
        .values_list("at", flat=True)
        .first()
    )
    age = (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0
    return SubscriptionLag(behind, max(0.0, age))


def lag_samples() -> list[tuple[WebhookSubscription, SubscriptionLag]]:
    """Every subscriber with its lag (the admin, the API and /metrics)."""
    version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    return [(sub, webhook_lag(sub, clock_version=version)) for sub in WebhookSubscription.objects.all()]


def lag_metrics() -> Iterable[Any]:
    """/metrics: each subscriber's acknowledged version and lag (read when scraped)."""
    from prometheus_client.core import GaugeMetricFamily

    acked = GaugeMetricFamily(
        "tidal_webhook_acked_version", "A subscriber's acknowledged version.", labels=["subscription", "active"]
    )
    lag = GaugeMetricFamily("tidal_webhook_lag_versions", "Changes not yet acknowledged.", labels=["subscription"])
    age = GaugeMetricFamily(
        "tidal_webhook_lag_seconds", "Age of the oldest change not yet acknowledged.", labels=["subscription"]
    )
    try:
        samples = lag_samples()
    except DatabaseError:
        logger.warning("webhook lag metrics unavailable", exc_info=True)
        return []
    for sub, behind in samples:
        acked.add_metric([str(sub.pk), "true" if sub.is_active else "false"], sub.acked_version)
        lag.add_metric([str(sub.pk)], behind.versions)
        age.add_metric([str(sub.pk)], behind.seconds)
    return [acked, lag, age]
