"""Django's model backend, reading an account's permissions in one query instead of two.

Django reads a user's own permissions and their groups' permissions with a query each, the
first time a request asks about any permission. Every API request asks (the permission
classes), so that is one query more than needed on each. Here both come from one ``UNION``:
each half uses its own table's user index, as Django's two queries do. The answers, and the
per-request cache on the user object, are Django's.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission


class OneQueryModelBackend(ModelBackend):
    def get_all_permissions(self, user_obj: Any, obj: Any = None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            fields = ("content_type__app_label", "codename")
            if user_obj.is_superuser:
                rows = Permission.objects.order_by().values_list(*fields)
            else:
                own = Permission.objects.filter(user=user_obj).order_by().values_list(*fields)
                rows = own.union(Permission.objects.filter(group__user=user_obj).order_by().values_list(*fields))
            user_obj._perm_cache = {f"{app_label}.{codename}" for app_label, codename in rows}
        perms: set[str] = user_obj._perm_cache
        return perms
