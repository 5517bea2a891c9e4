"""Who an account is, as the throttles, the token rules and the ingest API need to know."""

from __future__ import annotations

from typing import Any

from django.conf import settings


def is_service_account(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.groups.filter(name=settings.SERVICE_ACCOUNT_GROUP).exists()
    )
