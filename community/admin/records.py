"""The leave records' admin: filter by status, add a record (a leave), leave or rejoin the selected."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from tidalproject.paging import BigTableAdminMixin

from ..admin_links import user_page_url
from ..ids import parse_user_id
from ..membership import MembershipStatus
from ..models import ChangeSource, CommunityLeave
from ..record_status import CORRUPT, RecordStatus
from ..services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer, leave_community_layer
from .common import RecordFieldsMixin, UserIdSearchMixin


class RecordStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"
    _codes = {"active": MembershipStatus.ACTIVE, "left": MembershipStatus.LEFT, "corrupt": CORRUPT}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(key, key) for key in self._codes]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        code = self._codes.get(self.value() or "")
        if code is None:
            return queryset
        filtered: QuerySet[Any] = queryset.annotate(record_status=RecordStatus("value")).filter(record_status=code)
        return filtered


class LeaveAddForm(forms.ModelForm[CommunityLeave]):
    """Adding a record means making that user leave, through the service."""

    user_id = forms.CharField(max_length=20, strip=True, help_text="The user to make leave (0 to 2**63-1).")

    class Meta:
        model = CommunityLeave
        fields = ["user_id"]

    def clean_user_id(self) -> int:
        # The API's id rule, applied to the text as typed.
        try:
            return parse_user_id(self.cleaned_data["user_id"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def validate_unique(self) -> None:
        pass  # an existing record is not an error: leaving is idempotent


@admin.register(CommunityLeave)
class CommunityLeaveAdmin(RecordFieldsMixin, UserIdSearchMixin, BigTableAdminMixin, admin.ModelAdmin[CommunityLeave]):
    list_display = ["user_id", "status", "left_at", "raw_value", "user_page"]
    list_filter = [RecordStatusFilter]
    search_fields = ["user_id"]
    readonly_fields = ["user_id", "status", "left_at", "raw_value", "user_page"]
    actions = ["leave_selected", "rejoin_selected"]

    @admin.display(description="console")
    def user_page(self, obj: CommunityLeave) -> str:
        return format_html('<a href="{}">user page</a>', user_page_url(obj.user_id))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        # Read-only: a record changes only through the leave and rejoin actions.
        extra_context = {
            **(extra_context or {}),
            "show_save": False,
            "show_save_and_continue": False,
            "show_save_and_add_another": False,
        }
        return super().change_view(request, object_id, form_url, extra_context)

    def get_form(
        self, request: HttpRequest, obj: CommunityLeave | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = LeaveAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: CommunityLeave | None = None) -> Any:
        return ["user_id"] if obj is None else self.readonly_fields

    def get_readonly_fields(self, request: HttpRequest, obj: CommunityLeave | None = None) -> list[str]:
        return [] if obj is None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: CommunityLeave, form: Any, change: bool) -> None:
        if change:  # the change form is read-only; records change through the actions
            return
        leave_community_layer(user_id=obj.user_id, actor=request.user, source=ChangeSource.ADMIN)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        pass

    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        # The leave history is the audit trail; the admin log entry would duplicate it.
        return None

    def has_delete_permission(self, request: HttpRequest, obj: CommunityLeave | None = None) -> bool:
        # Deleting a record would rejoin a user without a trace: use the rejoin action.
        return False

    @admin.action(description="Make the selected users leave", permissions=["change"])
    def leave_selected(self, request: HttpRequest, queryset: QuerySet[CommunityLeave]) -> None:
        ids = list(queryset.values_list("user_id", flat=True))
        bulk_leave_community_layer(user_ids=ids, actor=request.user, source=ChangeSource.ADMIN)
        self.message_user(request, f"{len(ids)} user(s) are now left.", messages.SUCCESS)

    @admin.action(description="Make the selected users rejoin", permissions=["change"])
    def rejoin_selected(self, request: HttpRequest, queryset: QuerySet[CommunityLeave]) -> None:
        ids = list(queryset.values_list("user_id", flat=True))
        bulk_rejoin_community_layer(user_ids=ids, actor=request.user, source=ChangeSource.ADMIN)
        self.message_user(request, f"{len(ids)} user(s) are now active.", messages.SUCCESS)
