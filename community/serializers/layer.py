"""A user's status and history, and the bodies of leave, rejoin and bulk leave; the leave cache's report."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ..display import record_status_label, status_payload
from ..fields import UserIdField
from ..models import MAX_REASON_LENGTH, LeaveHistory
from ..selectors import LayerStatus

MAX_BULK = 1000


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


class BulkStatusSerializer(serializers.Serializer[Any]):
    results = LayerStatusSerializer(many=True)


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
