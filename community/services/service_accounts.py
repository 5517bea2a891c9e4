"""Service accounts: an account with exactly the permissions it needs, and an API token."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction


def service_account_create(*, username: str, perms: Iterable[str]) -> str:
    """Create or update a service account with exactly ``perms``; returns a new API token.

    Each call issues a new token (only its hash is stored, so an old one cannot be shown
    again); the account's earlier tokens keep working until they expire or are revoked.
    """
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    from accounts.services import token_issue

    wanted = []
    for label in perms:
        app_label, _, codename = label.partition(".")
        permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
        if permission is None:
            raise ValueError(f"no permission {label!r}")
        wanted.append(permission)
    with transaction.atomic():
        user, _ = get_user_model().objects.get_or_create(username=username)
        group, _ = Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)
        user.groups.add(group)
        user.user_permissions.set(wanted)
        _, token = token_issue(user=user)
    return token
