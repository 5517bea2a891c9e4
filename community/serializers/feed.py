"""The change feed (its query and its answer) and the status filter of the records list and export."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from rest_framework import serializers

from ..display import STATUS_FILTERS
from ..membership import MAX_USER_ID

FEED_DEFAULT_LIMIT = 100
FEED_MAX_LIMIT = 1000


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
