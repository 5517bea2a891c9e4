from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse

from community.admin import UserIdSearchMixin

from .models import CohortAggregate, CommunityAggregate, Signal
from .selectors import outcome_summary


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    """Written by the pipeline only: operators look, they do not edit."""

    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Signal)
class SignalAdmin(UserIdSearchMixin, ReadOnlyAdmin):
    list_display = ["id", "user_id", "item_id", "kind", "weight", "occurred_at", "received_at", "outcome", "sender"]
    list_filter = ["outcome", "kind"]
    search_fields = ["user_id"]
    list_select_related = ["sender"]
    date_hierarchy = "received_at"
    change_list_template = "admin/signals_app/signal/change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        # Counts by outcome over the last hour and day, gated included: what the gate held back.
        extra_context = {**(extra_context or {}), "outcome_summary": outcome_summary()}
        response: TemplateResponse = super().changelist_view(request, extra_context)  # type: ignore[assignment]
        return response


class AggregateAdmin(ReadOnlyAdmin):
    list_display = ["item_id", "kind", "hour", "count", "weight_sum", "last_at"]
    list_filter = ["kind"]
    date_hierarchy = "hour"


@admin.register(CommunityAggregate)
class CommunityAggregateAdmin(AggregateAdmin):
    list_display = ["community", *AggregateAdmin.list_display]
    list_filter = ["community", *AggregateAdmin.list_filter]
    list_select_related = ["community"]


@admin.register(CohortAggregate)
class CohortAggregateAdmin(AggregateAdmin):
    list_display = ["cohort", *AggregateAdmin.list_display]
    list_filter = ["cohort", *AggregateAdmin.list_filter]
    list_select_related = ["cohort"]
