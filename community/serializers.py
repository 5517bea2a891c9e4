from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers

from tidalproject.api import UserIdField

from .membership import CommunityMembership, MembershipStatus
from .models import LeaveHistory
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

    def to_representation(self, instance: LayerStatus) -> dict[str, Any]:
        return status_payload(instance.membership, corrupt=instance.corrupt)


class LeaveHistorySerializer(serializers.ModelSerializer[LeaveHistory]):
    status = serializers.SerializerMethodField()
    left_at_ns = serializers.SerializerMethodField()
    actor = serializers.SerializerMethodField()

    class Meta:
        model = LeaveHistory
        fields = ["version", "action", "status", "left_at_ns", "actor", "source", "at"]

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
