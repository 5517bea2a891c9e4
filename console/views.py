"""The operators' console in the admin: a dashboard, one user's page, and bulk leave.

Mounted by ``console.admin`` under ``/admin/community/communityleave/console/``
behind ``admin_site.admin_view`` (active staff, else the login page). Each view checks the
model permission it needs (403 otherwise), reads through selectors and writes through the
services only, so history and fence come with every change. The charts are drawn by
``console.charts``; what operators type is checked by ``console.forms``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils import timezone

from community.admin_links import CONSOLE_USER_URL
from community.display import STATUS_FILTERS, left_at_text, record_status_label, rfc3339
from community.exports import csv_export_response
from community.forms import BULK_MAX_IDS, BulkLeaveForm
from community.models import MAX_REASON_LENGTH, ChangeAction, ChangeSource, CommunityLeave, LeaveHistory
from community.permissions import ERASE_ANY, READ_ANY_SIGNALS
from community.selectors import (
    community_layer_history,
    community_layer_record,
    leave_changes_per_day,
    leave_record_counts,
)
from community.services.layer import (
    LayerChange,
    bulk_leave_community_layer,
    leave_community_layer,
    rejoin_community_layer,
)
from signals_app.selectors import outcomes_per_hour, user_recent_signals

from .charts import CHANGE_COLORS, OUTCOME_COLORS, stacked_bar_chart
from .forms import reason_or_message, user_id_or_message

LeaveAdmin = ModelAdmin[CommunityLeave]

HISTORY_SHOWN = 100
SIGNALS_SHOWN = 50
DAYS_SHOWN = 14
HOURS_SHOWN = 24
BULK_CHUNK = 1_000  # one service call (one transaction) per chunk
SAMPLE_SHOWN = 20

URL_DASHBOARD = "admin:community_console"
URL_USER = CONSOLE_USER_URL


# --- shared ------------------------------------------------------------------------------


def _require(request: HttpRequest, allowed: bool) -> None:
    if not allowed:
        raise PermissionDenied


def _context(request: HttpRequest, model_admin: LeaveAdmin, title: str, **extra: Any) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "may_change": model_admin.has_change_permission(request),
        "may_view_signals": request.user.has_perm(READ_ANY_SIGNALS),
        # The Erase button leads to signals_app's admin (erasure touches signals).
        "may_erase": request.user.is_staff and request.user.has_perm(ERASE_ANY),
        **extra,
    }


# --- dashboard ---------------------------------------------------------------------------


def dashboard(request: HttpRequest, *, model_admin: LeaveAdmin) -> HttpResponse:
    _require(request, model_admin.has_view_permission(request))
    per_day = leave_changes_per_day(days=DAYS_SHOWN)
    context = _context(
        request,
        model_admin,
        "Community layer: operator console",
        counts=leave_record_counts(),
        per_day=per_day,
        per_day_chart=stacked_bar_chart(
            [(f"{d.day:%m-%d}", {"leaves": d.leaves, "rejoins": d.rejoins}) for d in per_day], CHANGE_COLORS
        ),
        time_zone=timezone.get_current_timezone_name(),
    )
    if context["may_view_signals"]:
        per_hour = outcomes_per_hour(hours=HOURS_SHOWN)
        context["per_hour"] = per_hour
        context["per_hour_chart"] = stacked_bar_chart(
            [(f"{h.hour:%H}h", h.counts) for h in per_hour], OUTCOME_COLORS, label_every=3
        )
        context["outcome_labels"] = [label for label, _ in OUTCOME_COLORS]
    return TemplateResponse(request, "admin/community/console/dashboard.html", context)


def find_user(request: HttpRequest, *, model_admin: LeaveAdmin) -> HttpResponse:
    """The dashboard's search box: to the user's page, or back with a message."""
    _require(request, model_admin.has_view_permission(request))
    user_id = user_id_or_message(request, request.GET.get("user_id", ""))
    if user_id is None:
        return redirect(URL_DASHBOARD)
    return redirect(URL_USER, user_id=user_id)


# --- one user ----------------------------------------------------------------------------


def _history_rows(entries: Iterable[LeaveHistory]) -> list[dict[str, Any]]:
    return [
        {
            "version": entry.version,
            "action": entry.action,
            "status": record_status_label(entry.membership),
            "left_at": left_at_text(entry.membership),
            "actor": entry.actor_label or "-",
            "source": entry.get_source_display(),
            "at": entry.at,
            "reason": entry.reason,
        }
        for entry in entries
    ]


def user_page(request: HttpRequest, user_id: str, *, model_admin: LeaveAdmin) -> HttpResponse:
    _require(request, model_admin.has_view_permission(request))
    uid = user_id_or_message(request, user_id)
    if uid is None:
        return redirect(URL_DASHBOARD)
    stored = community_layer_record(user_id=uid)
    record = stored.status.membership
    history = community_layer_history(user_id=uid)
    context = _context(
        request,
        model_admin,
        f"User {uid}",
        user_id=uid,
        status="corrupt" if stored.status.corrupt else record_status_label(record),
        corrupt=stored.status.corrupt,
        left_at=rfc3339(record.left_at_ns) or "-",
        raw=stored.raw.hex(" ") if stored.raw is not None else None,
        history=_history_rows(history[:HISTORY_SHOWN]),
        history_total=history.count(),
        history_shown=HISTORY_SHOWN,
    )
    if context["may_view_signals"]:
        context["signals"] = list(user_recent_signals(user_id=uid)[:SIGNALS_SHOWN])
        context["signals_shown"] = SIGNALS_SHOWN
    return TemplateResponse(request, "admin/community/console/user.html", context)


_CHANGES: dict[str, Callable[..., LayerChange]] = {
    ChangeAction.LEAVE: leave_community_layer,
    ChangeAction.REJOIN: rejoin_community_layer,
}


def user_change(request: HttpRequest, user_id: str, *, action: ChangeAction, model_admin: LeaveAdmin) -> HttpResponse:
    """GET: what will happen, with a confirm button. POST: do it through the service."""
    _require(request, model_admin.has_change_permission(request))
    uid = user_id_or_message(request, user_id)
    if uid is None:
        return redirect(URL_DASHBOARD)
    if request.method == "POST":
        reason = reason_or_message(request)
        if reason is None:
            return redirect(request.path)
        change = _CHANGES[action](user_id=uid, actor=request.user, source=ChangeSource.ADMIN, reason=reason)
        messages.success(
            request, f"User {uid} is now {record_status_label(change.membership)} (version {change.version})."
        )
        return redirect(URL_USER, user_id=uid)
    stored = community_layer_record(user_id=uid)
    status = "corrupt" if stored.status.corrupt else record_status_label(stored.status.membership)
    context = _context(
        request,
        model_admin,
        f"Make user {uid} {action.value}?",
        user_id=uid,
        action=action.value,
        status=status,
        max_reason=MAX_REASON_LENGTH,
    )
    return TemplateResponse(request, "admin/community/console/user_change.html", context)


# --- bulk leave --------------------------------------------------------------------------


def _bulk_leave_in_chunks(request: HttpRequest, ids: list[int]) -> int:
    """Chunks of BULK_CHUNK, each one service call in its own transaction; returns how many
    ids were written before a database error (re-running is safe: leaving is idempotent)."""
    done = 0
    for start in range(0, len(ids), BULK_CHUNK):
        chunk = ids[start : start + BULK_CHUNK]
        try:
            bulk_leave_community_layer(user_ids=chunk, actor=request.user, source=ChangeSource.ADMIN)
        except DatabaseError:
            return done
        done += len(chunk)
    return done


def bulk_leave(request: HttpRequest, *, model_admin: LeaveAdmin) -> HttpResponse:
    """Step 1 checks the list and shows a confirmation page (nothing written);
    step 2 (the confirm button, the checked ids carried in a hidden field) makes them leave."""
    _require(request, model_admin.has_change_permission(request))
    form = BulkLeaveForm(request.POST, request.FILES) if request.method == "POST" else BulkLeaveForm()
    title = "Bulk leave"
    template = "admin/community/console/bulk_leave.html"
    if not form.is_valid():
        return TemplateResponse(request, template, _context(request, model_admin, title, form=form, max=BULK_MAX_IDS))
    ids: list[int] = form.cleaned_data["ids"]
    if "confirm" in request.POST:
        done = _bulk_leave_in_chunks(request, ids)
        if done == len(ids):
            messages.success(request, f"{done:,} user(s) are now left (source: admin).")
            return redirect(URL_DASHBOARD)
        messages.error(
            request,
            f"The database failed after {done:,} of {len(ids):,} ids; those are written. "
            "Confirm again to finish: users already left are left unchanged.",
        )
    confirm = _context(
        request,
        model_admin,
        "Bulk leave: confirm",
        count=len(ids),
        sample=ids[:SAMPLE_SHOWN],
        carried=" ".join(map(str, ids)),
    )
    return TemplateResponse(request, "admin/community/console/bulk_leave_confirm.html", confirm)


# --- export ------------------------------------------------------------------------------


def export_csv(request: HttpRequest, *, model_admin: LeaveAdmin) -> HttpResponse:
    """The records list's "Export CSV" button: the same streaming export as the API,
    for the status filter the list shows (``?status=``)."""
    _require(request, model_admin.has_view_permission(request))
    status = request.GET.get("status") or None
    if status is not None and status not in STATUS_FILTERS:
        messages.error(request, f"Unknown status {status!r}; choose from {', '.join(STATUS_FILTERS)}.")
        return redirect("admin:community_communityleave_changelist")
    # StreamingHttpResponse is an HttpResponseBase, which is what the admin's wrapper passes on.
    return csv_export_response(status)  # type: ignore[return-value]
