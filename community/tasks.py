"""Celery tasks of the community layer."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError

from tidalproject.celery import sweep_task

from .cache import leave_cache
from .webhooks.delivery import webhook_deliver
from .webhooks.waking import schedule_next, webhooks_sweep

logger = logging.getLogger(__name__)


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def report_leave_cache() -> dict[str, Any]:
    """Log this worker process's leave cache, checked against the records (operators, drills)."""
    state = leave_cache.report(compare=True)
    logger.info("leave cache report: %s", " ".join(f"{k}={v}" for k, v in state.items()))
    return state


@shared_task(
    acks_late=True,  # a worker killed mid-send: the message comes back; the lease expires
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=10,  # after that the sweep wakes the subscriber again
    soft_time_limit=120,
    time_limit=150,
    ignore_result=True,
)
def deliver_webhooks(subscription_id: int) -> str:
    """Send one subscriber its next batch of changes, then chain the next batch or the retry."""
    outcome = webhook_deliver(subscription_id=subscription_id)
    schedule_next(subscription_id, outcome)
    return outcome.result


@sweep_task
def sweep_webhooks() -> int:
    """Beat: wake every lagging subscriber (a lost kick delays, never loses, a delivery)."""
    return webhooks_sweep()
