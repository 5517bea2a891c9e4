"""Communities and cohorts: a group, its members, and the window and answer of its top items."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from ..fields import UserIdField
from ..models import slug_validator
from .layer import MAX_BULK


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
