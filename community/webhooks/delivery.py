"""One delivery: claim a subscriber, send its next batch, move its cursor or back off."""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.utils import timezone

from tidalproject import metrics

from ..models import LeaveHistory, WebhookDelivery, WebhookSubscription
from .sending import message_payload, post_signed, signed_message
from .ssrf import UnsafeTarget

logger = logging.getLogger(__name__)


def lease_seconds() -> float:
    """How long a claim lasts: longer than the longest exchange (connect, write, read)."""
    return 3 * float(settings.WEBHOOK_TIMEOUT_SECONDS) + 10


def backoff_seconds(failures: int, *, rng: random.Random | None = None) -> float:
    """Exponential back-off with jitter: half of base * 2**(failures-1) (capped) plus a random half."""
    cap = float(settings.WEBHOOK_RETRY_MAX_SECONDS)
    ceiling: float = min(cap, float(settings.WEBHOOK_RETRY_BASE_SECONDS) * 2.0 ** max(0, min(failures - 1, 30)))
    jitter: float = (rng or random).uniform(0, ceiling / 2)
    return float(ceiling / 2 + jitter)


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one call of ``webhook_deliver`` did. ``retry_in``: seconds until the next attempt
    (after a failure); ``more``: changes are waiting past the new cursor."""

    result: str  # idle, busy, waiting, delivered, skipped, failed, paused
    more: bool = False
    retry_in: float | None = None
    sent: int = 0


def _claim(subscription_id: int) -> str | None:
    token = secrets.token_hex(8)
    now = timezone.now()
    claimed = (
        WebhookSubscription.objects.filter(pk=subscription_id, is_active=True)
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
        .update(lease_until=now + timedelta(seconds=lease_seconds()), lease_token=token)
    )
    return token if claimed else None


def _release(subscription_id: int, token: str, **fields: Any) -> int:
    return WebhookSubscription.objects.filter(pk=subscription_id, lease_token=token).update(
        lease_until=None, lease_token="", **fields
    )


def _why_not(subscription_id: int) -> str:
    sub = WebhookSubscription.objects.filter(pk=subscription_id).first()
    if sub is None or not sub.is_active:
        return "paused"
    if sub.next_attempt_at is not None and sub.next_attempt_at > timezone.now():
        return "waiting"
    return "busy"


def webhook_deliver(*, subscription_id: int) -> DeliveryOutcome:
    """Send the next batch of changes to one subscriber, if it is its turn (see the module doc)."""
    token = _claim(subscription_id)
    if token is None:
        return DeliveryOutcome(_why_not(subscription_id))
    try:
        return _deliver_claimed(subscription_id, token)
    except BaseException:
        # Anything unexpected (the database going away, a time limit): free the claim if we
        # still can, so the next attempt need not wait for the lease to expire.
        try:
            _release(subscription_id, token)
        except DatabaseError:
            logger.warning("could not release webhook lease %s", subscription_id, exc_info=True)
        raise


def _deliver_claimed(subscription_id: int, token: str) -> DeliveryOutcome:
    sub = WebhookSubscription.objects.get(pk=subscription_id)
    basis = sub.acked_version
    entries = list(LeaveHistory.objects.filter(version__gt=basis).order_by("version")[: settings.WEBHOOK_BATCH_SIZE])
    if not entries:
        _release(sub.pk, token)
        return DeliveryOutcome("idle")
    last = entries[-1].version
    wanted = [entry for entry in entries if sub.wants(entry.action)]
    if not wanted:
        _release(sub.pk, token, acked_version=last)
        return DeliveryOutcome("skipped", more=_more_after(last))

    started = timezone.now()
    first_attempt = sub.consecutive_failures == 0
    msg_id = f"sub{sub.pk}_v{wanted[0].version}-{wanted[-1].version}"
    body, headers = signed_message(
        secret=sub.secret, msg_id=msg_id, payload=message_payload(wanted, now=started), now=started
    )
    t0 = time.perf_counter()
    status_code: int | None = None
    error = ""
    try:
        answer = post_signed(sub.url, body=body, headers=headers)
        status_code = answer.status_code
        if not 200 <= status_code < 300:
            error = f"HTTP {status_code}"
    except UnsafeTarget as exc:
        error = f"refused: {exc}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    duration = time.perf_counter() - t0
    ok = not error
    if first_attempt:
        metrics.WEBHOOK_FIRST_ATTEMPT_SECONDS.observe(max(0.0, (started - wanted[0].at).total_seconds()))
    metrics.WEBHOOK_ATTEMPTS.labels(result="ok" if ok else "failed").inc()

    now = timezone.now()
    with transaction.atomic():
        WebhookDelivery.objects.create(
            subscription_id=sub.pk,
            first_version=wanted[0].version,
            last_version=wanted[-1].version,
            changes=len(wanted),
            attempt=sub.consecutive_failures + 1,
            ok=ok,
            status_code=status_code,
            error=error[:500],
            started_at=started,
            duration_ms=int(duration * 1000),
        )
        if ok:
            # The cursor moves only from where this batch started: a lease lost to another
            # worker (ours expired) cannot move it twice or backwards.
            moved = (
                WebhookSubscription.objects.filter(pk=sub.pk, lease_token=token, acked_version=basis).update(
                    acked_version=last,
                    consecutive_failures=0,
                    failing_since=None,
                    next_attempt_at=None,
                    last_attempt_at=now,
                    last_success_at=now,
                    last_status_code=status_code,
                    last_error="",
                    lease_until=None,
                    lease_token="",
                )
                > 0
            )
            outcome = DeliveryOutcome("delivered", sent=len(wanted)) if moved else DeliveryOutcome("busy")
        else:
            failing_since = sub.failing_since or started
            failures = sub.consecutive_failures + 1
            pause = now - failing_since >= timedelta(seconds=settings.WEBHOOK_PAUSE_AFTER_SECONDS)
            retry_in = backoff_seconds(failures)
            fields: dict[str, Any] = {
                "consecutive_failures": failures,
                "failing_since": failing_since,
                "next_attempt_at": now + timedelta(seconds=retry_in),
                "last_attempt_at": now,
                "last_status_code": status_code,
                "last_error": error[:500],
            }
            if pause:
                fields.update(
                    is_active=False,
                    paused_reason=f"failing since {failing_since:%Y-%m-%d %H:%M:%S} UTC: {error}"[:200],
                )
            _release(sub.pk, token, **fields)
            outcome = DeliveryOutcome("paused") if pause else DeliveryOutcome("failed", retry_in=retry_in)
    if outcome.result == "paused":
        logger.warning("webhook subscription %s paused: %s", sub.pk, error)
    if outcome.result == "delivered":
        return DeliveryOutcome("delivered", sent=len(wanted), more=_more_after(last))
    return outcome


def _more_after(version: int) -> bool:
    """Whether a change past ``version`` is committed (read after the lease is released, so a
    change whose kick found the subscriber busy is not left waiting for the sweep)."""
    return LeaveHistory.objects.filter(version__gt=version).exists()
