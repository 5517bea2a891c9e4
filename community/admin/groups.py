"""Communities, cohorts and their members in the admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ..groups import GroupMember
from ..models import Cohort, CohortMember, Community, CommunityMember
from .common import UserIdSearchMixin


@admin.register(Community, Cohort)
class MemberGroupAdmin(admin.ModelAdmin[Any]):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(CommunityMember, CohortMember)
class GroupMemberAdmin(UserIdSearchMixin, admin.ModelAdmin[Any]):
    """Both member tables: the group's column is the one the model declares (``group_field``)."""

    search_fields = ["user_id"]
    show_full_result_count = False

    model: type[GroupMember]

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return ["user_id", self.model.group_field, "joined_at"]

    def get_list_filter(self, request: HttpRequest) -> list[Any]:
        return [self.model.group_field]

    def get_list_select_related(self, request: HttpRequest) -> list[str]:
        return [self.model.group_field]

    def get_autocomplete_fields(self, request: HttpRequest) -> list[str]:
        return [self.model.group_field]
