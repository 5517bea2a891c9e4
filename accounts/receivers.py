"""Log-in failures and lockouts, logged and counted for the metrics."""

from __future__ import annotations

import logging
from typing import Any

from tidalproject.metrics import LOGIN_FAILURES, LOGIN_LOCKOUTS

from .clientip import client_ip

logger = logging.getLogger(__name__)


def entry_of(request: Any) -> str:
    """Which door a log-in came through: ``admin``, ``api`` or ``other``."""
    path = str(getattr(request, "path", "") or "")
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/api/"):
        return "api"
    return "other"


def refused_while_locked(request: Any) -> bool:
    """Whether axes refused this log-in because its pair was already locked out.

    axes' backend marks such a request before any password is checked, and its failure
    handler then returns early, before it counts the failure (``axes_failures_since_start``
    stays None).
    """
    return (
        bool(getattr(request, "axes_locked_out", False)) and getattr(request, "axes_failures_since_start", None) is None
    )


def count_login_failure(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    entry = entry_of(request)
    reason = "locked" if refused_while_locked(request) else "credentials"
    LOGIN_FAILURES.labels(entry=entry, reason=reason).inc()
    logger.warning(
        "log-in failed",
        extra={
            "username": credentials.get("username"),
            "client_ip": client_ip(request) if request is not None else None,
            "entry": entry,
            "reason": reason,
        },
    )


def count_lockout(sender: Any, request: Any = None, username: str | None = None, **kwargs: Any) -> None:
    # axes signals again for every attempt refused during a lockout: count the lockout once.
    if refused_while_locked(request):
        return
    entry = entry_of(request)
    LOGIN_LOCKOUTS.labels(entry=entry).inc()
    logger.warning(
        "log-in locked out",
        extra={"username": username, "client_ip": kwargs.get("ip_address"), "entry": entry},
    )
