"""Communities, cohorts and their members in the admin."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from ..models import Cohort, CohortMember, Community, CommunityMember
from .common import UserIdSearchMixin


@admin.register(Community, Cohort)
class MemberGroupAdmin(admin.ModelAdmin[Any]):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(CommunityMember)
class CommunityMemberAdmin(UserIdSearchMixin, admin.ModelAdmin[CommunityMember]):
    list_display = ["user_id", "community", "joined_at"]
    list_filter = ["community"]
    search_fields = ["user_id"]
    list_select_related = ["community"]
    autocomplete_fields = ["community"]
    show_full_result_count = False


@admin.register(CohortMember)
class CohortMemberAdmin(UserIdSearchMixin, admin.ModelAdmin[CohortMember]):
    list_display = ["user_id", "cohort", "joined_at"]
    list_filter = ["cohort"]
    search_fields = ["user_id"]
    list_select_related = ["cohort"]
    autocomplete_fields = ["cohort"]
    show_full_result_count = False
