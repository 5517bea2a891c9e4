"""Creating and changing webhook subscribers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from ..models import ChangeAction, LeaveClock, WebhookSubscription
from .ssrf import check_url
from .waking import wake_subscriber


def check_actions(actions: Iterable[str]) -> list[str]:
    """The actions a subscriber may ask for: ChangeAction's values (data-driven)."""
    chosen = list(dict.fromkeys(actions))
    unknown = [a for a in chosen if a not in ChangeAction.values]
    if unknown:
        names = ", ".join(map(repr, unknown))
        raise ValueError(f"Unknown action(s) {names}; choose from {', '.join(ChangeAction.values)}.")
    return chosen


def webhook_subscription_create(
    *, name: str, url: str, actions: Iterable[str] = (), secret: str | None = None, after: int | None = None
) -> WebhookSubscription:
    """A new subscriber. It receives the changes after ``after`` (default: from now on)."""
    check_url(url)
    start = (
        after if after is not None else (LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0)
    )
    fields: dict[str, Any] = {"name": name, "url": url, "actions": check_actions(actions), "acked_version": start}
    if secret:
        fields["secret"] = secret
    subscription = WebhookSubscription.objects.create(**fields)
    transaction.on_commit(lambda: wake_subscriber(subscription.pk))
    return subscription


def webhook_subscription_update(*, subscription: WebhookSubscription, **changes: Any) -> WebhookSubscription:
    """Change url, name, actions, is_active or secret (a rotation: messages signed from then on
    use the new one). Resuming clears the failure state and wakes it."""
    if "url" in changes:
        check_url(changes["url"])
    if "actions" in changes:
        changes["actions"] = check_actions(changes["actions"])
    resumed = changes.get("is_active") is True and not subscription.is_active
    for field, value in changes.items():
        setattr(subscription, field, value)
    if resumed:
        subscription.paused_reason = ""
        subscription.failing_since = None
        subscription.consecutive_failures = 0
        subscription.next_attempt_at = None
    elif changes.get("is_active") is False:
        subscription.paused_reason = subscription.paused_reason or "paused by an operator"
    subscription.save()
    if subscription.is_active:
        transaction.on_commit(lambda: wake_subscriber(subscription.pk))
    return subscription
