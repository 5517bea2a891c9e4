from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from tidalproject.paging import BigTableAdminMixin, recent_filter

from .admin_links import user_page_url
from .display import left_at_text, record_status_label
from .ids import parse_user_id
from .membership import MAX_USER_ID, MembershipStatus
from .models import (
    ChangeAction,
    ChangeSource,
    Cohort,
    CohortMember,
    Community,
    CommunityLeave,
    CommunityMember,
    LeaveHistory,
    WebhookDelivery,
    WebhookSubscription,
)
from .permissions import READ_ANY
from .record_status import CORRUPT, RecordStatus
from .services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer, leave_community_layer
from .webhooks.lag import lag_samples
from .webhooks.ssrf import UnsafeTarget, check_url
from .webhooks.subscriptions import check_actions, webhook_subscription_create, webhook_subscription_update

# The admin index gains a link to the operators' console (admin/community/site_index.html
# extends the stock index). Set on the default site rather than a custom AdminSite, which
# would mean changing the project's URLconf and INSTALLED_APPS.
admin.site.index_template = "admin/community/site_index.html"


def _decoded_status(obj: CommunityLeave | LeaveHistory) -> str:
    return record_status_label(obj.membership)


def _decoded_left_at(obj: CommunityLeave | LeaveHistory) -> str:
    return left_at_text(obj.membership)


def _hex(obj: CommunityLeave | LeaveHistory) -> str:
    return bytes(obj.value).hex(" ")


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
class CommunityLeaveAdmin(UserIdSearchMixin, BigTableAdminMixin, admin.ModelAdmin[CommunityLeave]):
    list_display = ["user_id", "status", "left_at", "raw_value", "user_page"]
    list_filter = [RecordStatusFilter]
    search_fields = ["user_id"]
    readonly_fields = ["user_id", "status", "left_at", "raw_value", "user_page"]
    actions = ["leave_selected", "rejoin_selected"]

    @admin.display(description="status")
    def status(self, obj: CommunityLeave) -> str:
        return _decoded_status(obj)

    @admin.display(description="left at (UTC)")
    def left_at(self, obj: CommunityLeave) -> str:
        return _decoded_left_at(obj)

    @admin.display(description="raw value (hex)")
    def raw_value(self, obj: CommunityLeave) -> str:
        return _hex(obj)

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


@admin.register(LeaveHistory)
class LeaveHistoryAdmin(UserIdSearchMixin, BigTableAdminMixin, admin.ModelAdmin[LeaveHistory]):
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

    @admin.display(description="status")
    def status(self, obj: LeaveHistory) -> str:
        return _decoded_status(obj)

    @admin.display(description="left at (UTC)")
    def left_at(self, obj: LeaveHistory) -> str:
        return _decoded_left_at(obj)

    @admin.display(description="raw value (hex)")
    def raw_value(self, obj: LeaveHistory) -> str:
        return _hex(obj)

    def has_view_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        # Whoever may read the leave records may read their history.
        return super().has_view_permission(request, obj) or request.user.has_perm(READ_ANY)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: LeaveHistory | None = None) -> bool:
        return False


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


class WebhookSubscriptionForm(forms.ModelForm[WebhookSubscription]):
    class Meta:
        model = WebhookSubscription
        fields = ["name", "url", "actions", "is_active"]

    def clean_url(self) -> str:
        try:
            return check_url(self.cleaned_data["url"])
        except UnsafeTarget as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_actions(self) -> list[str]:
        actions = self.cleaned_data.get("actions") or []
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise forms.ValidationError(f"A JSON list of actions, e.g. {ChangeAction.values!r}; [] for every action.")
        try:
            return check_actions(actions)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin[WebhookSubscription]):
    """Subscribers with their acknowledged version and lag; created and changed through the
    webhook services (URL checked, resuming clears the failure state and wakes delivery)."""

    form = WebhookSubscriptionForm
    list_display = [
        "name",
        "url",
        "state",
        "acked_version",
        "lag_versions",
        "lag_seconds",
        "consecutive_failures",
        "failing_since",
        "last_status_code",
        "last_success_at",
    ]
    list_filter = ["is_active"]
    search_fields = ["name", "url"]
    readonly_fields = [
        "secret",
        "paused_reason",
        "acked_version",
        "lag_versions",
        "lag_seconds",
        "consecutive_failures",
        "failing_since",
        "next_attempt_at",
        "last_attempt_at",
        "last_success_at",
        "last_status_code",
        "last_error",
        "created_at",
    ]
    actions = ["pause_selected", "resume_selected"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        self._lags = {sub.pk: lag for sub, lag in lag_samples()}
        return super().changelist_view(request, extra_context)

    def _lag(self, obj: WebhookSubscription) -> Any:
        from .webhooks.lag import webhook_lag

        lags = getattr(self, "_lags", {})
        return lags.get(obj.pk) or webhook_lag(obj)

    @admin.display(description="state")
    def state(self, obj: WebhookSubscription) -> str:
        if not obj.is_active:
            return f"paused: {obj.paused_reason}" if obj.paused_reason else "paused"
        return "failing" if obj.consecutive_failures else "on"

    @admin.display(description="lag (changes)")
    def lag_versions(self, obj: WebhookSubscription) -> int:
        versions: int = self._lag(obj).versions
        return versions

    @admin.display(description="lag (seconds)")
    def lag_seconds(self, obj: WebhookSubscription) -> str:
        return f"{self._lag(obj).seconds:.1f}"

    def save_model(self, request: HttpRequest, obj: WebhookSubscription, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if change:
            changes = {k: data[k] for k in ("name", "url", "actions", "is_active")}
            webhook_subscription_update(subscription=obj, **changes)
        else:
            created = webhook_subscription_create(name=data["name"], url=data["url"], actions=data["actions"])
            obj.pk = created.pk
            if not data["is_active"]:
                webhook_subscription_update(subscription=created, is_active=False)

    @admin.action(description="Pause the selected subscriptions", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet[WebhookSubscription]) -> None:
        for sub in queryset:
            webhook_subscription_update(subscription=sub, is_active=False)
        self.message_user(request, "Paused.", messages.SUCCESS)

    @admin.action(description="Resume the selected subscriptions", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet[WebhookSubscription]) -> None:
        for sub in queryset:
            webhook_subscription_update(subscription=sub, is_active=True)
        self.message_user(request, "Resumed.", messages.SUCCESS)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin[WebhookDelivery]):
    """The delivery log: every attempt, its status code or error, and how long it took."""

    list_display = [
        "started_at",
        "subscription",
        "first_version",
        "last_version",
        "changes",
        "attempt",
        "ok",
        "status_code",
        "error",
        "duration_ms",
    ]
    list_filter = ["ok", "subscription"]
    list_select_related = ["subscription"]
    date_hierarchy = "started_at"
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: WebhookDelivery | None = None) -> bool:
        return False
