"""Celery tasks of the community layer."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from .models import CommunityLeave

logger = logging.getLogger(__name__)


@shared_task(soft_time_limit=60, time_limit=90, ignore_result=True)
def report_leave_cache() -> dict[str, Any]:
    """Log this worker process's leave cache, checked against the records (operators, drills)."""
    state = CommunityLeave.objects.cache.report(compare=True)
    logger.info("leave cache report: %s", " ".join(f"{k}={v}" for k, v in state.items()))
    return state
