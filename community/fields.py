"""Serializer fields shared by the community and signals APIs."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from .ids import parse_user_id
from .membership import MAX_USER_ID


class UserIdField(serializers.IntegerField):
    """A user (or item) id for serializers, by the rule of ``parse_user_id``."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", MAX_USER_ID)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        try:
            return parse_user_id(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc), code="invalid") from None
