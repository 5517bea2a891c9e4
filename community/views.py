from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import BasePagination, CursorPagination
from rest_framework.permissions import DjangoModelPermissions, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tidalproject.api import Pagination, WriteRateThrottle

from .access import ActionPermissions, MayChangeMembers, needs, own_user_id_or
from .cache import leave_cache
from .display import change_payload, record_status_payload
from .exports import csv_export_response
from .fields import UserIdField
from .models import ChangeSource, Cohort, Community, WebhookDelivery, WebhookSubscription
from .permissions import (
    ADD_COHORT_MEMBER,
    ADD_COMMUNITY_MEMBER,
    CHANGE_ANY,
    DELETE_COHORT_MEMBER,
    DELETE_COMMUNITY_MEMBER,
    READ_ANY,
    VIEW_COHORT,
)
from .selectors import (
    LayerStatus,
    community_layer_changes,
    community_layer_history,
    community_layer_records,
    community_layer_status,
    leave_clock_version,
    wait_for_change,
)
from .serializers import (
    BulkLeaveSerializer,
    BulkStatusSerializer,
    ChangeBodySerializer,
    ChangeFeedQuerySerializer,
    ChangeFeedSerializer,
    GroupSerializer,
    LayerStatusSerializer,
    LeaveCacheSerializer,
    LeaveHistorySerializer,
    MembershipChangeSerializer,
    MembersSerializer,
    StatusListQuerySerializer,
    WebhookDeliverySerializer,
    WebhookSubscriptionSerializer,
)
from .services.groups import SlugTaken, group_create, group_members_add, group_members_remove
from .services.layer import bulk_leave_community_layer, leave_community_layer, rejoin_community_layer
from .webhooks.lag import lag_samples
from .webhooks.ssrf import UnsafeTarget
from .webhooks.subscriptions import webhook_subscription_create, webhook_subscription_update

USER_ID_PARAM = OpenApiParameter("user_id", int, OpenApiParameter.PATH, description="The user's id, 0 to 2**63-1.")


class _UserIdPath(serializers.Serializer[Any]):
    user_id = UserIdField()


def parse_path_user_id(raw: str) -> int:
    """The ``{user_id}`` of a URL, or a 400 naming the rule."""
    path = _UserIdPath(data={"user_id": raw})
    path.is_valid(raise_exception=True)
    user_id: int = path.validated_data["user_id"]
    return user_id


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
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": ["Not a cursor from this list; use the next or previous link."]}) from None

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({"limit": [f"Must be an integer from 1 to {self.max_page_size}."]})
        return int(raw)


class CommunityLayerViewSet(ActionPermissions, viewsets.GenericViewSet[Any]):
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

    @staticmethod
    def _reason(request: Request) -> str:
        body = ChangeBodySerializer(data=request.data if request.data else {})
        body.is_valid(raise_exception=True)
        reason: str = body.validated_data["reason"]
        return reason

    @extend_schema(
        request=ChangeBodySerializer,
        responses=LayerStatusSerializer,
        summary="Leave the community layer",
        parameters=[USER_ID_PARAM],
    )
    @action(detail=True, methods=["post"])
    def leave(self, request: Request, user_id: str) -> Response:
        uid = self._user_id()
        reason = self._reason(request)
        change = leave_community_layer(user_id=uid, actor=request.user, source=ChangeSource.API, reason=reason)
        return self._answer(LayerStatus(change.membership, corrupt=False, version=change.version))

    @extend_schema(
        request=ChangeBodySerializer,
        responses=LayerStatusSerializer,
        summary="Rejoin the community layer",
        parameters=[USER_ID_PARAM],
    )
    @action(detail=True, methods=["post"])
    def rejoin(self, request: Request, user_id: str) -> Response:
        uid = self._user_id()
        reason = self._reason(request)
        change = rejoin_community_layer(user_id=uid, actor=request.user, source=ChangeSource.API, reason=reason)
        return self._answer(LayerStatus(change.membership, corrupt=False, version=change.version))

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
            wait_for_change(after=after, timeout=wait)
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


class _GroupViewSet(ActionPermissions, viewsets.GenericViewSet[Any]):
    """Communities and cohorts: create, list, read, members, top items."""

    # The top items (trending, attribution) read the signals' aggregates: signals_app.views
    # adds them to these viewsets.

    permission_classes = [IsAuthenticated]
    # Creating needs the model's add permission; membership changes are checked on the group
    # (404 first); any other action is a read, open to every account unless "*" says more.
    action_permissions = {"create": [DjangoModelPermissions], "members": [MayChangeMembers]}
    throttle_classes = [WriteRateThrottle]
    serializer_class = GroupSerializer
    lookup_field = "slug"
    # A slug's own rule: anything else (a NUL byte, say) is a 404 before the database sees it.
    lookup_value_regex = r"[a-z0-9][a-z0-9_-]{0,63}"
    member_perms: dict[str, str] = {}

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(GroupSerializer(page, many=True).data)

    def retrieve(self, request: Request, slug: str) -> Response:
        return Response(GroupSerializer(self.get_object()).data)

    def create(self, request: Request) -> Response:
        body = GroupSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            group = group_create(model=self.get_queryset().model, **body.validated_data)
        except SlugTaken:
            raise ValidationError({"slug": ["This slug is taken."]}) from None
        return Response(GroupSerializer(group).data, status=201)

    def _members_body(self, request: Request) -> Sequence[int]:
        body = MembersSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        user_ids: list[int] = body.validated_data["user_ids"]
        return user_ids

    @extend_schema(
        request=MembersSerializer,
        responses=MembershipChangeSerializer,
        summary="Add (POST) or remove (DELETE) up to 1,000 members by user id",
    )
    @action(detail=True, methods=["post", "delete"])
    def members(self, request: Request, slug: str) -> Response:
        group = self.get_object()
        user_ids = self._members_body(request)
        if request.method == "DELETE":
            change = group_members_remove(group=group, user_ids=user_ids)
            return Response({"removed": change.changed, "absent": change.unchanged})
        change = group_members_add(group=group, user_ids=user_ids)
        return Response({"added": change.changed, "already": change.unchanged})


class CommunityViewSet(_GroupViewSet):
    queryset = Community.objects.all()
    member_perms = {"add": ADD_COMMUNITY_MEMBER, "delete": DELETE_COMMUNITY_MEMBER}


class CohortViewSet(_GroupViewSet):
    queryset = Cohort.objects.all()
    action_permissions = {**_GroupViewSet.action_permissions, "*": [needs(VIEW_COHORT)]}
    member_perms = {"add": ADD_COHORT_MEMBER, "delete": DELETE_COHORT_MEMBER}


class LeaveCacheView(APIView):
    """This web process's leave cache after a sync: its fence position, size and counters.

    With ``?compare=1`` it is also checked against the records (a full read of the gated
    ids). Needs the permission to read any user's leave record.
    """

    permission_classes = [IsAuthenticated, needs(READ_ANY, "Reading the leave cache")]

    @extend_schema(
        parameters=[OpenApiParameter("compare", bool, description="Also compare with the records.")],
        responses=LeaveCacheSerializer,
        summary="This process's leave cache",
    )
    def get(self, request: Request) -> Response:
        compare = request.query_params.get("compare", "") in ("1", "true", "yes")
        return Response(leave_cache.report(compare=compare))


class ReadPermissions(DjangoModelPermissions):
    """DjangoModelPermissions, with the view permission required to read."""

    perms_map = {**DjangoModelPermissions.perms_map, "GET": ["%(app_label)s.view_%(model_name)s"]}


class WebhookSubscriptionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet[Any]
):
    """Webhook subscriptions: a URL, a secret, the actions wanted, on or paused; each with its
    acknowledged version and lag. The secret is shown once, in the answer to the creation."""

    queryset = WebhookSubscription.objects.all()
    serializer_class = WebhookSubscriptionSerializer
    permission_classes = [IsAuthenticated, ReadPermissions]
    throttle_classes = [WriteRateThrottle]

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        context["lags"] = {sub.pk: lag for sub, lag in lag_samples()}
        return context

    def create(self, request: Request) -> Response:
        body = WebhookSubscriptionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            subscription = webhook_subscription_create(
                name=data["name"],
                url=data["url"],
                actions=data.get("actions", []),
                secret=data.get("secret") or None,
                after=data.get("after"),
            )
        except UnsafeTarget as exc:
            raise ValidationError({"url": [str(exc)]}) from None
        answer = WebhookSubscriptionSerializer(subscription, context=self.get_serializer_context()).data
        return Response({**answer, "secret": subscription.secret}, status=201)

    def partial_update(self, request: Request, pk: str) -> Response:
        subscription = self.get_object()
        body = WebhookSubscriptionSerializer(subscription, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        changes = {k: v for k, v in body.validated_data.items() if k in ("name", "url", "actions", "is_active")}
        try:
            webhook_subscription_update(subscription=subscription, **changes)
        except UnsafeTarget as exc:
            raise ValidationError({"url": [str(exc)]}) from None
        return Response(WebhookSubscriptionSerializer(subscription, context=self.get_serializer_context()).data)

    @extend_schema(responses=WebhookDeliverySerializer(many=True), summary="A subscriber's delivery log, newest first")
    @action(detail=True, methods=["get"], serializer_class=WebhookDeliverySerializer)
    def deliveries(self, request: Request, pk: str) -> Response:
        subscription = self.get_object()
        page = self.paginate_queryset(WebhookDelivery.objects.filter(subscription=subscription).order_by("-pk"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)
