"""What the community layer's admin pages share: a record's decoded fields, search by user id."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..display import left_at_text, record_status_label
from ..membership import MAX_USER_ID
from ..models import CommunityLeave, LeaveHistory


class RecordFieldsMixin:
    """A stored record's fields as the admin shows them (records and history alike): the
    decoded status and left-at time (community.display) and the raw bytes."""

    @admin.display(description="status")
    def status(self, obj: CommunityLeave | LeaveHistory) -> str:
        return record_status_label(obj.membership)

    @admin.display(description="left at (UTC)")
    def left_at(self, obj: CommunityLeave | LeaveHistory) -> str:
        return left_at_text(obj.membership)

    @admin.display(description="raw value (hex)")
    def raw_value(self, obj: CommunityLeave | LeaveHistory) -> str:
        return bytes(obj.value).hex(" ")


class UserIdSearchMixin:
    """Search by whole user id only: anything else matches nothing instead of a 500."""

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not (term.isascii() and term.isdigit()) or int(term) > MAX_USER_ID:
            return queryset.none(), False
        return queryset.filter(user_id=int(term)), False
