"""Mounts the console under the leave records' admin (``/admin/community/communityleave/console/``).

The console depends on community and signals_app, and community may not depend on it: so the
console's URLs are added to community's registered ``CommunityLeaveAdmin`` from here, before
the model's own, as signals_app adds its erase action to the same admin.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from django.contrib import admin
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from community.models import ChangeAction, CommunityLeave

from . import views


def console_urls(model_admin: ModelAdmin[CommunityLeave]) -> list[URLPattern]:
    """The operators' console (console/views.py), each view behind the admin's own login."""

    def wrap(view: Callable[..., HttpResponse], **defaults: Any) -> Callable[..., HttpResponse]:
        def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return view(request, *args, model_admin=model_admin, **defaults, **kwargs)

        return model_admin.admin_site.admin_view(update_wrapper(bound, view))

    return [
        path("console/", wrap(views.dashboard), name="community_console"),
        path("console/find/", wrap(views.find_user), name="community_console_find"),
        path("console/export.csv", wrap(views.export_csv), name="community_console_export"),
        path("console/bulk-leave/", wrap(views.bulk_leave), name="community_console_bulk_leave"),
        path("console/user/<str:user_id>/", wrap(views.user_page), name="community_console_user"),
        path(
            "console/user/<str:user_id>/leave/",
            wrap(views.user_change, action=ChangeAction.LEAVE),
            name="community_console_user_leave",
        ),
        path(
            "console/user/<str:user_id>/rejoin/",
            wrap(views.user_change, action=ChangeAction.REJOIN),
            name="community_console_user_rejoin",
        ),
    ]


_leave_admin = admin.site.get_model_admin(CommunityLeave)
_model_urls = _leave_admin.get_urls


def _get_urls() -> list[URLPattern]:
    return [*console_urls(_leave_admin), *_model_urls()]


_leave_admin.get_urls = _get_urls  # type: ignore[method-assign]
