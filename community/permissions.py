from __future__ import annotations

from typing import Any

from rest_framework.exceptions import PermissionDenied

READ_ANY = "community.view_communityleave"
CHANGE_ANY = "community.change_communityleave"
# Erasing anyone but oneself (signals_app.erasure): a permission of its own, not implied by CHANGE_ANY.
ERASE_ANY = "community.erase_communityleave"


def ensure_may_act_on(user: Any, *, user_id: int, perm: str) -> None:
    """A user acts on their own user id (their account's id); others need ``perm``.

    Superusers have every permission; staff and service accounts are given theirs.
    """
    if user.pk == user_id or user.has_perm(perm):
        return
    raise PermissionDenied(f"You may only act on your own user id ({user.pk}) without the {perm} permission.")
