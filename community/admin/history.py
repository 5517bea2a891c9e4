"""The leave history's admin: read-only, for whoever may read the records."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from tidalproject.paging import BigTableAdminMixin, recent_filter

from ..models import LeaveHistory
from ..permissions import READ_ANY
from .common import RecordFieldsMixin, UserIdSearchMixin


@admin.register(LeaveHistory)
class LeaveHistoryAdmin(RecordFieldsMixin, UserIdSearchMixin, BigTableAdminMixin, admin.ModelAdmin[LeaveHistory]):
    list_display = ["version", "user_id", "action", "status", "left_at", "actor_label", "source", "at", "reason"]
    # No date hierarchy (its first step reads the distinct years or months of every change):
    # "changed in the last …" instead, on the index of ``at``.
    list_filter = ["action", "source", recent_filter("at", parameter="changed", title="changed")]
    search_fields = ["user_id"]
    fields = [
        "version",
        "user_id",
        "action",
        "status",
        "left_at",
        "raw_value",
        "actor",
        "actor_label",
        "source",
        "at",
        "reason",
    ]
    readonly_fields = ["status", "left_at", "raw_value"]

    def has_view_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        # Whoever may read the leave records may read their history.
        return super().has_view_permission(request, obj) or request.user.has_perm(READ_ANY)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        return False
