from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from tidalproject.api import UserIdField, WriteRateThrottle

from .models import ChangeSource
from .permissions import CHANGE_ANY, READ_ANY, ensure_may_act_on
from .selectors import LayerStatus, community_layer_history, community_layer_status
from .serializers import (
    BulkLeaveSerializer,
    BulkStatusSerializer,
    LayerStatusSerializer,
    LeaveHistorySerializer,
)
from .services import bulk_leave_community_layer, leave_community_layer, rejoin_community_layer

USER_ID_PARAM = OpenApiParameter("user_id", int, OpenApiParameter.PATH, description="The user's id, 0 to 2**63-1.")


class _UserIdPath(serializers.Serializer[Any]):
    user_id = UserIdField()


class CommunityLayerViewSet(viewsets.GenericViewSet[Any]):
    """Leave, rejoin and read a user's membership of the community layer.

    A user acts on their own user id; accounts with the model permissions act on any.
    """

    permission_classes = [IsAuthenticated]
    throttle_classes = [WriteRateThrottle]
    serializer_class = LayerStatusSerializer
    lookup_field = "user_id"
    # Anything up to the next slash reaches the view, so a bad id gets a 400 naming the rule.
    lookup_value_regex = r"[^/]+"

    def _user_id(self, perm: str) -> int:
        path = _UserIdPath(data={"user_id": self.kwargs["user_id"]})
        path.is_valid(raise_exception=True)
        user_id: int = path.validated_data["user_id"]
        ensure_may_act_on(self.request.user, user_id=user_id, perm=perm)
        return user_id

    @staticmethod
    def _answer(status: LayerStatus) -> Response:
        return Response(LayerStatusSerializer(status).data)

    @extend_schema(responses=LayerStatusSerializer, summary="A user's status", parameters=[USER_ID_PARAM])
    def retrieve(self, request: Request, user_id: str) -> Response:
        return self._answer(community_layer_status(user_id=self._user_id(READ_ANY)))

    @extend_schema(
        request=None, responses=LayerStatusSerializer, summary="Leave the community layer", parameters=[USER_ID_PARAM]
    )
    @action(detail=True, methods=["post"])
    def leave(self, request: Request, user_id: str) -> Response:
        uid = self._user_id(CHANGE_ANY)
        record = leave_community_layer(user_id=uid, actor=request.user, source=ChangeSource.API)
        return self._answer(LayerStatus(record, corrupt=False))

    @extend_schema(
        request=None, responses=LayerStatusSerializer, summary="Rejoin the community layer", parameters=[USER_ID_PARAM]
    )
    @action(detail=True, methods=["post"])
    def rejoin(self, request: Request, user_id: str) -> Response:
        uid = self._user_id(CHANGE_ANY)
        record = rejoin_community_layer(user_id=uid, actor=request.user, source=ChangeSource.API)
        return self._answer(LayerStatus(record, corrupt=False))

    @extend_schema(
        responses=LeaveHistorySerializer(many=True),
        summary="A user's leave history, newest first",
        parameters=[USER_ID_PARAM],
    )
    @action(detail=True, methods=["get"], serializer_class=LeaveHistorySerializer)
    def history(self, request: Request, user_id: str) -> Response:
        entries = community_layer_history(user_id=self._user_id(READ_ANY))
        page = self.paginate_queryset(entries)
        return self.get_paginated_response(LeaveHistorySerializer(page, many=True).data)

    @extend_schema(
        request=BulkLeaveSerializer,
        responses={200: BulkStatusSerializer, 400: OpenApiResponse(description="A bad id, named by index")},
        summary="Make up to 1,000 users leave, all or nothing (operators)",
    )
    @action(detail=False, methods=["post"], url_path="bulk-leave", serializer_class=BulkLeaveSerializer)
    def bulk_leave(self, request: Request) -> Response:
        if not request.user.has_perm(CHANGE_ANY):
            raise PermissionDenied(f"Bulk leave needs the {CHANGE_ANY} permission.")
        body = BulkLeaveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user_ids: list[int] = body.validated_data["user_ids"]
        records = bulk_leave_community_layer(user_ids=user_ids, actor=request.user, source=ChangeSource.API)
        return Response(
            {"results": [LayerStatusSerializer(LayerStatus(records[u], corrupt=False)).data for u in user_ids]}
        )
