"""The community layer API: a user's status, leave, rejoin, history, and bulk leave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.decorators import action
from rest_framework.pagination import BasePagination
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from tidalproject.api import Pagination, WriteRateThrottle

from ..access import ActionPermissions, needs, own_user_id_or
from ..models import ChangeSource
from ..permissions import CHANGE_ANY, READ_ANY
from ..selectors import LayerStatus, community_layer_history, community_layer_status
from ..serializers.layer import (
    BulkLeaveSerializer,
    BulkStatusSerializer,
    ChangeBodySerializer,
    LayerStatusSerializer,
    LeaveHistorySerializer,
)
from ..services.layer import LayerChange, bulk_leave_community_layer, leave_community_layer, rejoin_community_layer
from .feed import ChangeFeedAndRecords, StatusCursorPagination
from .user_ids import USER_ID_PARAM, parse_path_user_id

_F = TypeVar("_F", bound=Callable[..., Any])


def _change_schema(summary: str) -> Callable[[_F], _F]:
    """Leave's and rejoin's schema: a reason in the body, the status after the change."""
    return extend_schema(
        request=ChangeBodySerializer, responses=LayerStatusSerializer, summary=summary, parameters=[USER_ID_PARAM]
    )


class CommunityLayerViewSet(ActionPermissions, ChangeFeedAndRecords):
    """Leave, rejoin and read a user's membership of the community layer.

    A user acts on their own user id; accounts with the model permissions act on any.
    """

    permission_classes = [IsAuthenticated]

    @property
    def pagination_class(self) -> type[BasePagination]:  # type: ignore[override]
        # The list of records is cursor-paginated (no count of a big table); the rest, as set.
        return StatusCursorPagination if getattr(self, "action", None) == "list" else Pagination

    action_permissions = {
        "retrieve": [own_user_id_or(READ_ANY)],
        "history": [own_user_id_or(READ_ANY)],
        "leave": [own_user_id_or(CHANGE_ANY)],
        "rejoin": [own_user_id_or(CHANGE_ANY)],
        "changes": [needs(READ_ANY, "The change feed")],
        "list": [needs(READ_ANY, "Listing records")],
        "export": [needs(READ_ANY, "Listing records")],
        "bulk_leave": [needs(CHANGE_ANY, "Bulk leave")],
    }
    throttle_classes = [WriteRateThrottle]
    serializer_class = LayerStatusSerializer
    lookup_field = "user_id"
    # Anything up to the next slash reaches the view, so a bad id gets a 400 naming the rule.
    lookup_value_regex = r"[^/]+"

    def _user_id(self) -> int:
        return parse_path_user_id(self.kwargs["user_id"])

    @staticmethod
    def _answer(status: LayerStatus) -> Response:
        return Response(LayerStatusSerializer(status).data)

    @extend_schema(responses=LayerStatusSerializer, summary="A user's status", parameters=[USER_ID_PARAM])
    def retrieve(self, request: Request, user_id: str) -> Response:
        return self._answer(community_layer_status(user_id=self._user_id()))

    def _change(self, request: Request, change: Callable[..., LayerChange]) -> Response:
        """Leave or rejoin: the path's user id is checked first, then the body's reason."""
        uid = self._user_id()
        body = ChangeBodySerializer(data=request.data if request.data else {})
        body.is_valid(raise_exception=True)
        done = change(user_id=uid, actor=request.user, source=ChangeSource.API, reason=body.validated_data["reason"])
        return self._answer(LayerStatus(done.membership, corrupt=False, version=done.version))

    @_change_schema("Leave the community layer")
    @action(detail=True, methods=["post"])
    def leave(self, request: Request, user_id: str) -> Response:
        return self._change(request, leave_community_layer)

    @_change_schema("Rejoin the community layer")
    @action(detail=True, methods=["post"])
    def rejoin(self, request: Request, user_id: str) -> Response:
        return self._change(request, rejoin_community_layer)

    @extend_schema(
        responses=LeaveHistorySerializer(many=True),
        summary="A user's leave history, newest first",
        parameters=[USER_ID_PARAM],
    )
    @action(detail=True, methods=["get"], serializer_class=LeaveHistorySerializer)
    def history(self, request: Request, user_id: str) -> Response:
        entries = community_layer_history(user_id=self._user_id())
        page = self.paginate_queryset(entries)
        return self.get_paginated_response(LeaveHistorySerializer(page, many=True).data)

    @extend_schema(
        request=BulkLeaveSerializer,
        responses={200: BulkStatusSerializer, 400: OpenApiResponse(description="A bad id, named by index")},
        summary="Make up to 1,000 users leave, all or nothing (operators)",
    )
    @action(detail=False, methods=["post"], url_path="bulk-leave", serializer_class=BulkLeaveSerializer)
    def bulk_leave(self, request: Request) -> Response:
        body = BulkLeaveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user_ids: list[int] = body.validated_data["user_ids"]
        changes = bulk_leave_community_layer(
            user_ids=user_ids, actor=request.user, source=ChangeSource.API, reason=body.validated_data["reason"]
        )
        return Response(
            {
                "results": [
                    LayerStatusSerializer(
                        LayerStatus(changes[u].membership, corrupt=False, version=changes[u].version)
                    ).data
                    for u in user_ids
                ]
            }
        )
