from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from community.admin.common import UserIdSearchMixin
from community.admin_links import user_page_url
from community.forms import BulkLeaveForm
from community.groups import GroupAggregate
from community.ids import parse_user_id
from community.models import ChangeSource, CommunityLeave
from community.permissions import CHANGE_SIGNALS, ERASE_ANY
from tidalproject.paging import BigTableAdminMixin, recent_filter

from .erasure import erasure_job_create, user_erase
from .models import SIGNAL_FIELDS, CohortAggregate, CommunityAggregate, ErasureJob, ErasureJobUser, Outcome, Signal
from .selectors import outcome_summary, signal_kinds
from .services.processing import failed_signals_retry


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
        *SIGNAL_FIELDS,
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
        response: TemplateResponse = super().changelist_view(request, extra_context)
        return response

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CHANGE_SIGNALS)

    @admin.action(description="Retry the selected failed signals", permissions=["retry"])
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Signal]) -> None:
        ids = list(queryset.filter(outcome=Outcome.FAILED).values_list("id", flat=True))
        count = failed_signals_retry(signal_ids=ids)
        self.message_user(request, f"{count} failed signal(s) put back to pending and enqueued.", messages.SUCCESS)


@admin.register(CommunityAggregate, CohortAggregate)
class AggregateAdmin(ReadOnlyAdmin):
    """Both aggregate tables: the group's column is the one the model declares (``group_field``)."""

    model: type[GroupAggregate]
    _by_hour = recent_filter("hour", parameter="hour", title="hour")

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        return [self.model.group_field, "item_id", "kind", "hour", "count", "weight_sum", "last_at"]

    def get_list_filter(self, request: HttpRequest) -> list[Any]:
        return [self.model.group_field, KindFilter, self._by_hour]

    def get_list_select_related(self, request: HttpRequest) -> list[str]:
        return [self.model.group_field]


# --- erasure ------------------------------------------------------------------------------------


class ErasureUploadForm(BulkLeaveForm):
    """The bulk leave form's rules (pasted or uploaded ids, every bad one named), with the
    bulk erasure's limit and a confirmation box."""

    confirm = forms.BooleanField(
        label="I understand: every listed user's signals are deleted and their contributions taken back",
        required=True,
    )

    limit_unit = "a job"

    def max_ids(self) -> int:
        return int(settings.ERASURE_JOB_MAX_USERS)


class ErasureJobUserInline(admin.TabularInline[ErasureJobUser, ErasureJob]):
    model = ErasureJobUser
    fields = ["position", "user_id", "state", "version", "signals_removed", "aggregate_rows_changed", "error"]
    readonly_fields = ["position", "user_id", "state", "version", "signals_removed", "aggregate_rows_changed", "error"]
    can_delete = False
    extra = 0
    max_num = 0
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ErasureJob)
class ErasureJobAdmin(admin.ModelAdmin[ErasureJob]):
    """Bulk erasures: *Add* uploads a list (run by a Celery task); each job shows its users'
    results. Also the console's per-user Erase page."""

    list_display = ["id", "state", "total", "created_by_label", "source", "created_at", "finished_at"]
    readonly_fields = [
        "state",
        "total",
        "created_by_label",
        "source",
        "created_at",
        "started_at",
        "finished_at",
        "kicked_at",
    ]
    exclude = ["created_by"]
    inlines = [ErasureJobUserInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_staff and request.user.has_perm(ERASE_ANY))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_add_permission(request) or super().has_view_permission(request, obj)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None) -> Any:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = ErasureUploadForm(request.POST, request.FILES) if request.method == "POST" else ErasureUploadForm()
        if request.method == "POST" and form.is_valid():
            job = erasure_job_create(user_ids=form.cleaned_data["ids"], actor=request.user, source=ChangeSource.ADMIN)
            self.message_user(request, f"Erasure job {job.pk} of {job.total:,} user(s) started.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:signals_app_erasurejob_change", args=[job.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Erase many users",
            "form": form,
            "max": settings.ERASURE_JOB_MAX_USERS,
        }
        return TemplateResponse(request, "admin/signals_app/erasure/upload.html", context)

    def get_urls(self) -> list[URLPattern]:
        erase = self.admin_site.admin_view(self.erase_user_view)
        return [path("erase-user/<str:user_id>/", erase, name="signals_app_erase_user"), *super().get_urls()]

    def erase_user_view(self, request: HttpRequest, user_id: str) -> HttpResponse:
        """GET: what erasing will do, with a confirm button. POST: erase, back to the user's page."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        try:
            uid = parse_user_id(user_id)
        except ValueError as exc:
            self.message_user(request, f"User id {user_id!r}: {exc}", messages.ERROR)
            return redirect("admin:community_console")
        if request.method == "POST":
            receipt = user_erase(user_id=uid, actor=request.user, source=ChangeSource.ADMIN)
            if receipt.already_erased:
                text = f"User {uid} was already erased (version {receipt.version}): nothing changed."
            else:
                text = (
                    f"User {uid} erased (version {receipt.version}): {receipt.signals_removed:,} signal(s) removed, "
                    f"{receipt.aggregate_rows_changed:,} aggregate row(s) changed."
                )
            self.message_user(request, text, messages.SUCCESS)
            return redirect(user_page_url(uid))
        signals = Signal.objects.filter(user_id=uid)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Erase user {uid}?",
            "user_id": uid,
            "signal_count": signals.count(),
            "attributed_count": signals.filter(outcome=Outcome.ATTRIBUTED).count(),
        }
        return TemplateResponse(request, "admin/signals_app/erasure/erase_user.html", context)


def _may_erase(request: HttpRequest) -> bool:
    return bool(request.user.is_staff and request.user.has_perm(ERASE_ANY))


@admin.action(description="Erase the selected users (a bulk erasure job)", permissions=["erase"])
def erase_selected_users(modeladmin: Any, request: HttpRequest, queryset: QuerySet[CommunityLeave]) -> Any:
    limit = settings.ERASURE_JOB_MAX_USERS
    ids = list(queryset.values_list("user_id", flat=True)[: limit + 1])
    if len(ids) > limit:
        modeladmin.message_user(
            request,
            f"More than {limit:,} users selected: at most {limit:,} a job (ERASURE_JOB_MAX_USERS). "
            "Nothing was erased; narrow the selection.",
            messages.ERROR,
        )
        return None
    job = erasure_job_create(user_ids=ids, actor=request.user, source=ChangeSource.ADMIN)
    modeladmin.message_user(request, f"Erasure job {job.pk} of {job.total:,} user(s) started.", messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:signals_app_erasurejob_change", args=[job.pk]))


# The leave records' admin lives in community, which must not import this app: the action
# that erases (it touches signals) is added to it from here.
_leave_admin = admin.site.get_model_admin(CommunityLeave)
_leave_admin.actions = [*(_leave_admin.actions or ()), erase_selected_users]
_leave_admin.has_erase_permission = _may_erase  # type: ignore[attr-defined]  # offered only to who may erase
