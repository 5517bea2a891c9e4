from __future__ import annotations

import base64
import binascii
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from .display import STATUS_FILTERS, record_status_label, status_payload
from .fields import UserIdField
from .membership import MAX_USER_ID
from .models import (
    MAX_REASON_LENGTH,
    ChangeAction,
    LeaveHistory,
    WebhookDelivery,
    WebhookSubscription,
    slug_validator,
)
from .selectors import LayerStatus

MAX_BULK = 1000
FEED_DEFAULT_LIMIT = 100
FEED_MAX_LIMIT = 1000


class LayerStatusSerializer(serializers.Serializer[LayerStatus]):
    """A user's standing. ``corrupt`` is true where the stored record cannot be read:
    the gate then treats the user as left (fail closed)."""

    user_id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["active", "left"])
    left_at = serializers.CharField(allow_null=True, help_text="RFC 3339, nanosecond precision, UTC")
    left_at_ns = serializers.IntegerField(allow_null=True, help_text="Nanoseconds since the Unix epoch")
    corrupt = serializers.BooleanField()
    version = serializers.IntegerField(
        required=False,
        help_text="Leave and rejoin only: the clock version of the change made, or of the record kept"
        " where nothing changed (0: never changed)",
    )

    def to_representation(self, instance: LayerStatus) -> dict[str, Any]:
        payload = status_payload(instance.membership, corrupt=instance.corrupt)
        if instance.version is not None:
            payload["version"] = instance.version
        return payload


class LeaveHistorySerializer(serializers.ModelSerializer[LeaveHistory]):
    status = serializers.SerializerMethodField()
    left_at_ns = serializers.SerializerMethodField()
    actor = serializers.SerializerMethodField()

    class Meta:
        model = LeaveHistory
        # signals_removed and aggregate_rows_changed: an erasure's receipt (null otherwise).
        fields = [
            "version",
            "action",
            "status",
            "left_at_ns",
            "actor",
            "source",
            "at",
            "reason",
            "signals_removed",
            "aggregate_rows_changed",
        ]

    def get_status(self, entry: LeaveHistory) -> str | None:
        record = entry.membership
        return None if record is None else record_status_label(record)

    def get_left_at_ns(self, entry: LeaveHistory) -> int | None:
        record = entry.membership
        return None if record is None else record.left_at_ns

    def get_actor(self, entry: LeaveHistory) -> str | None:
        return entry.actor_label or None


def _reason_field() -> serializers.CharField:
    return serializers.CharField(
        max_length=MAX_REASON_LENGTH,
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=True,
        help_text=f"Why (optional, at most {MAX_REASON_LENGTH} characters); kept in the history and sent downstream.",
    )


class ChangeBodySerializer(serializers.Serializer[Any]):
    """The optional body of a leave or a rejoin."""

    reason = _reason_field()


class BulkLeaveSerializer(serializers.Serializer[Any]):
    user_ids = serializers.ListField(child=UserIdField(), min_length=1, max_length=MAX_BULK, allow_empty=False)
    reason = _reason_field()


class ChangeSerializer(serializers.Serializer[Any]):
    """One change of the feed (and of a webhook message)."""

    version = serializers.IntegerField()
    user_id = serializers.IntegerField()
    action = serializers.CharField(help_text="A ChangeAction: leave, rejoin, ...")
    status = serializers.CharField(help_text="The record after the change: active, left, or corrupt")
    left_at = serializers.CharField(allow_null=True)
    left_at_ns = serializers.IntegerField(allow_null=True)
    at = serializers.DateTimeField()
    actor = serializers.CharField(allow_null=True)
    # A field named like Field.source: fine at run time, the stubs see an attribute clash.
    source = serializers.CharField()  # type: ignore[assignment]
    reason = serializers.CharField(allow_blank=True)


class ChangeFeedSerializer(serializers.Serializer[Any]):
    results = ChangeSerializer(many=True)
    after = serializers.IntegerField(help_text="The version asked after.")
    next_after = serializers.IntegerField(help_text="Pass as ?after= to continue: the last version returned.")
    next = serializers.CharField(help_text="The URL that continues the feed.")
    has_more = serializers.BooleanField(help_text="More changes were already committed past next_after.")
    clock_version = serializers.IntegerField(help_text="The newest committed version at the time of the read.")


class ChangeFeedQuerySerializer(serializers.Serializer[Any]):
    after = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=MAX_USER_ID, help_text="Changes after this version."
    )
    limit = serializers.IntegerField(
        required=False, default=FEED_DEFAULT_LIMIT, min_value=1, max_value=FEED_MAX_LIMIT, help_text="1 to 1,000"
    )
    wait = serializers.FloatField(
        required=False,
        default=0,
        min_value=0,
        help_text="Seconds to wait for a change when there is none yet (at most FEED_MAX_WAIT_SECONDS).",
    )

    def validate_wait(self, value: float) -> float:
        limit = settings.FEED_MAX_WAIT_SECONDS
        if not math.isfinite(value) or value > limit:
            raise serializers.ValidationError(f"Must be a number of seconds from 0 to {limit}.")
        return value


class StatusListQuerySerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(
        choices=STATUS_FILTERS, required=False, help_text="Only records of this status; all records when absent."
    )


class BulkStatusSerializer(serializers.Serializer[Any]):
    results = LayerStatusSerializer(many=True)


class GroupSerializer(serializers.Serializer[Any]):
    """A community or a cohort."""

    slug = serializers.SlugField(max_length=64, help_text="1 to 64 of a-z, 0-9, - and _")
    name = serializers.CharField(max_length=200)
    created_at = serializers.DateTimeField(read_only=True)

    def validate_slug(self, value: str) -> str:
        try:
            slug_validator(value)
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.messages) from None
        return value


class MembersSerializer(serializers.Serializer[Any]):
    user_ids = serializers.ListField(child=UserIdField(), min_length=1, max_length=MAX_BULK, allow_empty=False)


class MembershipChangeSerializer(serializers.Serializer[Any]):
    added = serializers.IntegerField(required=False)
    already = serializers.IntegerField(required=False)
    removed = serializers.IntegerField(required=False)
    absent = serializers.IntegerField(required=False)


class WindowQuerySerializer(serializers.Serializer[Any]):
    kind = serializers.RegexField(r"^[a-z0-9_]{1,32}$", required=False, help_text="[a-z0-9_]{1,32}")
    since = serializers.DateTimeField(
        required=False, help_text="RFC 3339; rounded down to the hour. Default: 24 hours before until (or now)"
    )
    until = serializers.DateTimeField(required=False, help_text="RFC 3339; hours starting before it")
    limit = serializers.IntegerField(required=False, default=20, min_value=1, max_value=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("since") and attrs.get("until") and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": ["Must be later than since."]})
        return attrs


class TopItemSerializer(serializers.Serializer[Any]):
    item_id = serializers.IntegerField()
    kind = serializers.CharField()
    count = serializers.IntegerField()
    weight_sum = serializers.FloatField()
    last_at = serializers.DateTimeField()


class TopItemsSerializer(serializers.Serializer[Any]):
    results = TopItemSerializer(many=True)


class LeaveCacheSerializer(serializers.Serializer[Any]):
    pid = serializers.IntegerField()
    version = serializers.IntegerField()
    generation = serializers.IntegerField()
    size = serializers.IntegerField(help_text="Users held as gated (left or corrupt).")
    warms = serializers.IntegerField()
    syncs = serializers.IntegerField()
    feed_rows = serializers.IntegerField()
    last_warm_seconds = serializers.FloatField()
    last_lag = serializers.IntegerField(help_text="Changes behind at the last sync that found any.")
    matches_database = serializers.BooleanField(required=False)
    only_in_cache = serializers.IntegerField(required=False)
    only_in_database = serializers.IntegerField(required=False)


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
        help_text="A Standard Webhooks secret (whsec_ and base64 of 24 to 64 bytes); generated when absent.",
    )
    after = serializers.IntegerField(
        write_only=True,
        required=False,
        min_value=0,
        max_value=MAX_USER_ID,
        help_text="Deliver the changes after this version (0: all history). Default: from now on.",
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
            "consecutive_failures",
            "failing_since",
            "next_attempt_at",
            "last_attempt_at",
            "last_success_at",
            "last_status_code",
            "last_error",
            "created_at",
        ]
        read_only_fields = [
            "paused_reason",
            "acked_version",
            "consecutive_failures",
            "failing_since",
            "next_attempt_at",
            "last_attempt_at",
            "last_success_at",
            "last_status_code",
            "last_error",
            "created_at",
        ]

    def validate_url(self, value: str) -> str:
        from .webhooks.ssrf import UnsafeTarget, check_url

        try:
            return check_url(value)
        except UnsafeTarget as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_secret(self, value: str) -> str:
        return _check_secret(value)

    def _lag(self, obj: WebhookSubscription) -> Any:
        from .webhooks.lag import webhook_lag

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
            "first_version",
            "last_version",
            "changes",
            "attempt",
            "ok",
            "status_code",
            "error",
            "started_at",
            "duration_ms",
        ]
