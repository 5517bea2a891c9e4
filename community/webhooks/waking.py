"""Queueing deliveries: the kick after a change commits, the chain after a batch, the sweep."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Q
from django.utils import timezone

from ..models import LeaveClock, WebhookDelivery, WebhookSubscription
from .delivery import DeliveryOutcome

logger = logging.getLogger(__name__)


def _enqueue(subscription_ids: Iterable[int], *, countdown: float | None = None) -> int:
    from ..tasks import deliver_webhooks

    count = 0
    for pk in subscription_ids:
        if countdown is None:
            deliver_webhooks.apply_async((pk,), retry=False)
        else:
            deliver_webhooks.apply_async((pk,), countdown=countdown, retry=False)
        count += 1
    return count


def kick_webhooks() -> None:
    """After a change commits: wake the delivery of every active subscriber.

    Never raises: the change is committed and a broker or database hiccup here only delays
    delivery until the sweep.
    """
    from kombu.exceptions import OperationalError as BrokerError

    try:
        now = timezone.now()
        # A subscriber being delivered to (lease held) re-checks for new changes after its
        # batch; one backing off has its retry scheduled: neither needs another task.
        ids = list(
            WebhookSubscription.objects.filter(is_active=True)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
            .values_list("pk", flat=True)
        )
        _enqueue(ids)
    except (BrokerError, DatabaseError, OSError):
        logger.warning("webhook kick failed; the sweep will deliver", exc_info=True)


def schedule_next(subscription_id: int, outcome: DeliveryOutcome) -> None:
    """Chain the next step of a subscriber's delivery: the next batch, or the retry."""
    if outcome.retry_in is not None:
        _enqueue([subscription_id], countdown=outcome.retry_in)
    elif outcome.more:
        _enqueue([subscription_id])


def webhooks_sweep() -> int:
    """Wake every active subscriber whose cursor lags the clock and whose turn it is; remove
    delivery log rows past retention. Returns how many were woken."""
    version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    now = timezone.now()
    ids = list(
        WebhookSubscription.objects.filter(is_active=True, acked_version__lt=version)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .values_list("pk", flat=True)
    )
    WebhookDelivery.objects.filter(started_at__lt=now - timedelta(days=settings.WEBHOOK_LOG_RETENTION_DAYS)).delete()
    return _enqueue(ids)


def wake_subscriber(subscription_id: int) -> None:
    """Wake one subscriber's delivery (a new or resumed subscription); never raises."""
    from kombu.exceptions import OperationalError as BrokerError

    try:
        _enqueue([subscription_id])
    except (BrokerError, OSError):
        logger.warning("could not wake webhook subscription %s; the sweep will", subscription_id, exc_info=True)
