from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from community.admin import UserIdSearchMixin
from tidalproject.paging import BigTableAdminMixin, recent_filter

from .models import CohortAggregate, CommunityAggregate, Outcome, Signal
from .selectors import outcome_summary, signal_kinds
from .services import retry_failed_signals


class KindFilter(admin.SimpleListFilter):
    """The kinds stored, read from the (kind, id) index one kind at a time, where Django's
    own filter for a field would run ``SELECT DISTINCT kind`` over every row."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        kinds = signal_kinds()
        chosen = self.value()
        if chosen and chosen not in kinds:
            kinds.append(chosen)  # a kind given in the address stays visible as chosen
        return [(kind, kind) for kind in kinds]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        kind = self.value()
        return queryset.filter(kind=kind) if kind else queryset


class ReadOnlyAdmin(BigTableAdminMixin, admin.ModelAdmin[Any]):
    """Written by the pipeline only: operators look, they do not edit."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Signal)
class SignalAdmin(UserIdSearchMixin, ReadOnlyAdmin):
    list_display = [
        "id",
        "user_id",
        "item_id",
        "kind",
        "weight",
        "occurred_at",
        "received_at",
        "outcome",
        "gated_reason",
        "fence_at_receipt",
        "fence_at_processing",
        "sender",
    ]
    # No date hierarchy: its first step reads the distinct years (or months, days) of every
    # signal. "Received in the last …" bounds the list instead.
    list_filter = [
        "outcome",
        "gated_reason",
        KindFilter,
        recent_filter("received_at", parameter="received", title="received"),
    ]
    actions = ["retry_failed"]
    search_fields = ["user_id"]
    list_select_related = ["sender"]
    change_list_template = "admin/signals_app/signal/change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        # Counts by outcome over the last hour and day, gated included: what the gate held back.
        extra_context = {**(extra_context or {}), "outcome_summary": outcome_summary()}
        response: TemplateResponse = super().changelist_view(request, extra_context)  # type: ignore[assignment]
        return response

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("signals_app.change_signal")

    @admin.action(description="Retry the selected failed signals", permissions=["retry"])
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Signal]) -> None:
        ids = list(queryset.filter(outcome=Outcome.FAILED).values_list("id", flat=True))
        count = retry_failed_signals(signal_ids=ids)
        self.message_user(request, f"{count} failed signal(s) put back to pending and enqueued.", messages.SUCCESS)


class AggregateAdmin(ReadOnlyAdmin):
    list_display = ["item_id", "kind", "hour", "count", "weight_sum", "last_at"]
    list_filter = [KindFilter, recent_filter("hour", parameter="hour", title="hour")]


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
