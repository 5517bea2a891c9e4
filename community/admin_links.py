"""Links into the operators' console (the ``console`` app mounts it under the leave records' admin)."""

from __future__ import annotations

from django.urls import reverse

CONSOLE_USER_URL = "admin:community_console_user"


def user_page_url(user_id: int) -> str:
    return reverse(CONSOLE_USER_URL, kwargs={"user_id": user_id})
