"""Webhook subscriptions (through the webhook services) and their delivery log in the admin."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..models import WEBHOOK_ATTEMPT_FIELDS, WEBHOOK_DELIVERY_STATE, ChangeAction, WebhookDelivery, WebhookSubscription
from ..webhooks.lag import lag_samples
from ..webhooks.ssrf import UnsafeTarget, check_url
from ..webhooks.subscriptions import check_actions, webhook_subscription_create, webhook_subscription_update


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
    # The signing secret is shown once, on the page after the add (response_add), never again.
    readonly_fields = [
        "paused_reason",
        "acked_version",
        "lag_versions",
        "lag_seconds",
        *WEBHOOK_DELIVERY_STATE,
        "created_at",
    ]
    actions = ["pause_selected", "resume_selected"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        self._lags = {sub.pk: lag for sub, lag in lag_samples()}
        return super().changelist_view(request, extra_context)

    def _lag(self, obj: WebhookSubscription) -> Any:
        from ..webhooks.lag import webhook_lag

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

    def response_add(self, request: HttpRequest, obj: WebhookSubscription, post_url_continue: str | None = None) -> Any:
        created = WebhookSubscription.objects.get(pk=obj.pk)  # as stored by the service, its secret too
        context = {**self.admin_site.each_context(request), "title": "Subscription added", "subscription": created}
        return TemplateResponse(request, "admin/community/webhooksubscription/created.html", context)

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
        *WEBHOOK_ATTEMPT_FIELDS,
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
