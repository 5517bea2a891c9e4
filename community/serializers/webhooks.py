"""Webhook subscriptions (the secret's rule, the lag) and their delivery log."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from rest_framework import serializers

from ..membership import MAX_USER_ID
from ..models import (
    WEBHOOK_ATTEMPT_FIELDS,
    WEBHOOK_DELIVERY_STATE,
    ChangeAction,
    LeaveClock,
    WebhookDelivery,
    WebhookSubscription,
)


def _check_secret(value: str) -> str:
    raw = value.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise serializers.ValidationError("Must be whsec_ followed by base64.") from None
    if not 24 <= len(key) <= 64:
        raise serializers.ValidationError("Must encode 24 to 64 bytes.")
    return value


class WebhookSubscriptionSerializer(serializers.ModelSerializer[WebhookSubscription]):
    """A subscriber as the API shows it; ``secret`` and ``after`` are written, never read."""

    url = serializers.CharField(max_length=2000, help_text="http:// or https://, a public address")
    actions = serializers.ListField(
        child=serializers.ChoiceField(choices=ChangeAction.choices),
        required=False,
        max_length=len(ChangeAction.choices),
        help_text="Actions wanted; empty or absent means every action.",
    )
    secret = serializers.CharField(
        write_only=True,
        required=False,
        max_length=200,
        help_text="A Standard Webhooks secret (whsec_ and base64 of 24 to 64 bytes); generated when absent at"
        " creation. A PATCH with a secret rotates it: messages signed from then on use the new one.",
    )
    after = serializers.IntegerField(
        write_only=True,
        required=False,
        min_value=0,
        max_value=MAX_USER_ID,
        help_text="Deliver the changes after this version (0: all history; at most the latest version)."
        " Default: from now on. Set only at creation.",
    )
    lag_versions = serializers.SerializerMethodField()
    lag_seconds = serializers.SerializerMethodField()

    class Meta:
        model = WebhookSubscription
        fields = [
            "id",
            "name",
            "url",
            "actions",
            "is_active",
            "paused_reason",
            "secret",
            "after",
            "acked_version",
            "lag_versions",
            "lag_seconds",
            *WEBHOOK_DELIVERY_STATE,
            "created_at",
        ]
        read_only_fields = ["paused_reason", "acked_version", *WEBHOOK_DELIVERY_STATE, "created_at"]

    def validate_url(self, value: str) -> str:
        from ..webhooks.ssrf import UnsafeTarget, check_url

        try:
            return check_url(value)
        except UnsafeTarget as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_secret(self, value: str) -> str:
        return _check_secret(value)

    def validate_after(self, value: int) -> int:
        if self.instance is not None:
            raise serializers.ValidationError("Set only when the subscription is created.")
        latest = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first() or 0
        if value > latest:
            raise serializers.ValidationError(f"Must be at most the latest version, {latest}.")
        return value

    def _lag(self, obj: WebhookSubscription) -> Any:
        from ..webhooks.lag import webhook_lag

        lags = self.context.get("lags") or {}
        return lags.get(obj.pk) or webhook_lag(obj)

    def get_lag_versions(self, obj: WebhookSubscription) -> int:
        versions: int = self._lag(obj).versions
        return versions

    def get_lag_seconds(self, obj: WebhookSubscription) -> float:
        return round(float(self._lag(obj).seconds), 3)


class WebhookDeliverySerializer(serializers.ModelSerializer[WebhookDelivery]):
    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            *WEBHOOK_ATTEMPT_FIELDS,
            "started_at",
            "duration_ms",
        ]
