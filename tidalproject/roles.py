"""Who an account is, as the throttles, the token rules and the ingest API need to know."""

from __future__ import annotations

from typing import Any

from django.conf import settings

_CACHE = "_is_service_account"


def is_service_account(user: Any) -> bool:
    """Whether the account is in the service accounts' group.

    Asked twice by an ingest request (its throttle's scope, then its key rule): the answer is
    kept on the user object, as Django keeps its permissions there, so for the request's life.
    """
    if user is None or not user.is_authenticated:
        return False
    answer = getattr(user, _CACHE, None)
    if answer is None:
        answer = user.groups.filter(name=settings.SERVICE_ACCOUNT_GROUP).exists()
        setattr(user, _CACHE, answer)
    return bool(answer)
