from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from tidalproject.api import UserIdField

from .membership import CommunityMembership, MembershipStatus
from .models import LeaveHistory, slug_validator
from .selectors import LayerStatus

MAX_BULK = 1000


def _rfc3339(left_at_ns: int | None) -> str | None:
    if left_at_ns is None:
        return None
    seconds, nanos = divmod(left_at_ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


def status_payload(membership: CommunityMembership, *, corrupt: bool = False) -> dict[str, Any]:
    return {
        "user_id": membership.user_id,
        "status": "left" if membership.status == MembershipStatus.LEFT else "active",
        "left_at": _rfc3339(membership.left_at_ns),
        "left_at_ns": membership.left_at_ns,
        "corrupt": corrupt,
    }


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
            "signals_removed",
            "aggregate_rows_changed",
        ]

    def get_status(self, entry: LeaveHistory) -> str | None:
        record = entry.membership
        return None if record is None else ("left" if record.status == MembershipStatus.LEFT else "active")

    def get_left_at_ns(self, entry: LeaveHistory) -> int | None:
        record = entry.membership
        return None if record is None else record.left_at_ns

    def get_actor(self, entry: LeaveHistory) -> str | None:
        return entry.actor_label or None


class BulkLeaveSerializer(serializers.Serializer[Any]):
    user_ids = serializers.ListField(child=UserIdField(), min_length=1, max_length=MAX_BULK, allow_empty=False)


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
    since = serializers.DateTimeField(required=False, help_text="RFC 3339; rounded down to the hour")
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
