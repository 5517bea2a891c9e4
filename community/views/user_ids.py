"""The ``{user_id}`` of a URL: its rule, and its description in the API schema."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from ..fields import UserIdField

USER_ID_PARAM = OpenApiParameter("user_id", int, OpenApiParameter.PATH, description="The user's id, 0 to 2**63-1.")


class _UserIdPath(serializers.Serializer[Any]):
    user_id = UserIdField()


def parse_path_user_id(raw: str) -> int:
    """The ``{user_id}`` of a URL, or a 400 naming the rule."""
    path = _UserIdPath(data={"user_id": raw})
    path.is_valid(raise_exception=True)
    user_id: int = path.validated_data["user_id"]
    return user_id
