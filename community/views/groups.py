"""Communities and cohorts: create, list, read, members (signals_app adds the top items)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import DjangoModelPermissions, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from tidalproject.api import WriteRateThrottle

from ..access import ActionPermissions, MayChangeMembers, needs
from ..models import Cohort, Community
from ..permissions import (
    ADD_COHORT_MEMBER,
    ADD_COMMUNITY_MEMBER,
    DELETE_COHORT_MEMBER,
    DELETE_COMMUNITY_MEMBER,
    VIEW_COHORT,
)
from ..serializers.groups import GroupSerializer, MembershipChangeSerializer, MembersSerializer
from ..services.groups import SlugTaken, group_create, group_members_add, group_members_remove


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
