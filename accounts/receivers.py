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


def count_login_failure(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    entry = entry_of(request)
    LOGIN_FAILURES.labels(entry=entry).inc()
    logger.warning(
        "log-in failed",
        extra={
            "username": credentials.get("username"),
            "client_ip": client_ip(request) if request is not None else None,
            "entry": entry,
        },
    )


def count_lockout(sender: Any, request: Any = None, username: str | None = None, **kwargs: Any) -> None:
    entry = entry_of(request)
    LOGIN_LOCKOUTS.labels(entry=entry).inc()
    logger.warning(
        "log-in locked out",
        extra={"username": username, "client_ip": kwargs.get("ip_address"), "entry": entry},
    )
