"""API tokens: issued once, stored only as a hash (django-rest-knox), expiring, rotated."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from knox.models import AuthToken
from knox.settings import knox_settings

from tidalproject.roles import is_service_account

logger = logging.getLogger(__name__)


def token_ttl_for(*, user: Any) -> timedelta:
    """How long a new token of ``user`` lives: longer for service accounts."""
    if is_service_account(user):
        return timedelta(days=settings.SERVICE_TOKEN_TTL_DAYS)
    ttl: timedelta = knox_settings.TOKEN_TTL
    return ttl


def token_issue(*, user: Any, ttl: timedelta | None = None) -> tuple[AuthToken, str]:
    """A new token for ``user``; returns the stored row (a hash) and the token, shown once."""
    instance, token = AuthToken.objects.create(user=user, expiry=ttl or token_ttl_for(user=user))
    logger.info("API token issued", extra={"username": user.get_username(), "token_key": instance.token_key})
    return instance, token


def token_rotate(*, user: Any, overlap: timedelta) -> tuple[AuthToken, str, int]:
    """A new token for ``user``; the others keep working for ``overlap``, then expire.

    Tokens that expire sooner keep their expiry. Returns the new row, the token and how many
    older tokens were shortened.
    """
    with transaction.atomic():
        # One rotation of an account at a time.
        type(user).objects.select_for_update().filter(pk=user.pk).first()
        cutoff = timezone.now() + overlap
        shortened = (
            AuthToken.objects.filter(user=user)
            .filter(Q(expiry__isnull=True) | Q(expiry__gt=cutoff))
            .update(expiry=cutoff)
        )
        instance, token = token_issue(user=user)
    logger.info(
        "API token rotated",
        extra={"username": user.get_username(), "token_key": instance.token_key, "old_until": cutoff.isoformat()},
    )
    return instance, token, shortened


def tokens_revoke(*, tokens: QuerySet[AuthToken]) -> int:
    """Revoke (delete) ``tokens``: they stop authenticating at once."""
    keys = [(t.user.get_username(), t.token_key) for t in tokens.select_related("user")]
    deleted, _ = tokens.delete()
    for username, token_key in keys:
        logger.info("API token revoked", extra={"username": username, "token_key": token_key})
    return deleted


def tokens_delete_expired() -> int:
    """Delete every expired token; returns how many. They no longer authenticate anyway."""
    deleted: int = AuthToken.objects.filter(expiry__lt=timezone.now()).delete()[0]
    if deleted:
        logger.info("expired API tokens deleted", extra={"count": deleted})
    return deleted
