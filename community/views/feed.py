"""The operators' reads of the community layer: the change feed, the records by status and their CSV export."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from ..display import change_payload, record_status_payload
from ..exports import csv_export_response
from ..ids import parse_user_id
from ..selectors import (
    community_layer_changes,
    community_layer_changes_wait,
    community_layer_records,
    leave_clock_version,
)
from ..serializers.feed import ChangeFeedQuerySerializer, ChangeFeedSerializer, StatusListQuerySerializer
from ..serializers.layer import LayerStatusSerializer


class StatusCursorPagination(CursorPagination):
    """``?cursor=&limit=``: records by user id, 100 a page by default, at most 1,000.

    A cursor stays valid however many rows are added before it; a bad one is a 400.
    """

    ordering = "user_id"
    page_size = 100
    page_size_query_param = "limit"
    max_page_size = 1000

    def decode_cursor(self, request: Request) -> Any:
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                parse_user_id(cursor.position)  # DRF checks the offset, not the position: a user id here
        except (NotFound, ValueError):
            raise ValidationError({"cursor": ["Not a cursor from this list; use the next or previous link."]}) from None
        return cursor

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({"limit": [f"Must be an integer from 1 to {self.max_page_size}."]})
        return int(raw)


class ChangeFeedAndRecords(viewsets.GenericViewSet[Any]):
    """The operators' reads of ``/api/community-layer/``: ``changes/``, the list and ``export/``
    (their permissions are CommunityLayerViewSet's)."""

    @extend_schema(
        parameters=[ChangeFeedQuerySerializer],
        responses=ChangeFeedSerializer,
        summary="The change feed: every change after a version, in version order, gap-free (operators)",
    )
    @action(detail=False, methods=["get"], serializer_class=ChangeFeedSerializer)
    def changes(self, request: Request) -> Response:
        query = ChangeFeedQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after: int = query.validated_data["after"]
        limit: int = query.validated_data["limit"]
        wait: float = query.validated_data["wait"]
        if wait:
            community_layer_changes_wait(after=after, timeout=wait)
        entries = community_layer_changes(after=after, limit=limit)
        clock_version = leave_clock_version()
        next_after = entries[-1].version if entries else after
        next_url = request.build_absolute_uri(f"{request.path}?{urlencode({'after': next_after, 'limit': limit})}")
        return Response(
            {
                "results": [change_payload(entry) for entry in entries],
                "after": after,
                "next_after": next_after,
                "next": next_url,
                "has_more": clock_version > next_after,
                "clock_version": clock_version,
            }
        )

    def _status_filter(self, request: Request) -> str | None:
        query = StatusListQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        status: str | None = query.validated_data.get("status")
        return status

    @extend_schema(
        parameters=[StatusListQuerySerializer, OpenApiParameter("cursor", str), OpenApiParameter("limit", int)],
        responses=LayerStatusSerializer(many=True),
        summary="Stored records by status, in user id order, cursor-paginated (operators)",
    )
    def list(self, request: Request) -> Response:
        status = self._status_filter(request)
        page = self.paginate_queryset(community_layer_records(status=status))
        return self.get_paginated_response([record_status_payload(r.user_id, r.value) for r in page or []])

    @extend_schema(
        parameters=[StatusListQuerySerializer],
        responses={(200, "text/csv"): OpenApiTypes.STR},
        summary="The same records as a streaming CSV export (operators)",
    )
    @action(detail=False, methods=["get"], url_path="export")
    def export(self, request: Request) -> StreamingHttpResponse:
        status = self._status_filter(request)
        return csv_export_response(status)
