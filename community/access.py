"""Who may do what through the API: DRF permission classes, declared on each view or action.

One mechanism for every endpoint. A view lists its classes in ``permission_classes``; a
viewset adds each action's in ``action_permissions`` (``ActionPermissions``). The answers:
401 for an anonymous request (``IsAuthenticated`` comes first), 400 for a malformed user id
in the URL before any 403, 403 naming the permission that is missing.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from .ids import parse_user_id


class Needs(BasePermission):
    """The account needs ``perm``. Made with ``needs(perm, what)``."""

    perm: ClassVar[str]

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.has_perm(self.perm))


def needs(perm: str, what: str | None = None) -> type[BasePermission]:
    """A permission class for ``perm``; its 403 says "<what> needs the <perm> permission."
    (DRF's generic message when ``what`` is None)."""
    attrs: dict[str, Any] = {"perm": perm}
    if what is not None:
        attrs["message"] = f"{what} needs the {perm} permission."
    return type(f"Needs_{perm.replace('.', '_')}", (Needs,), attrs)


class OwnUserIdOr(BasePermission):
    """A user acts on their own user id (the URL's ``{user_id}``, their account's id); others
    need ``perm``. Superusers have every permission; staff and service accounts are given theirs.

    A malformed id passes here, so that the view answers 400 naming the rule (400 before 403).
    """

    perm: ClassVar[str]

    def has_permission(self, request: Request, view: Any) -> bool:
        try:
            user_id = parse_user_id(view.kwargs["user_id"])
        except ValueError:
            return True
        if request.user.pk == user_id or request.user.has_perm(self.perm):
            return True
        raise PermissionDenied(
            f"You may only act on your own user id ({request.user.pk}) without the {self.perm} permission."
        )


def own_user_id_or(perm: str) -> type[BasePermission]:
    return type(f"OwnUserIdOr_{perm.replace('.', '_')}", (OwnUserIdOr,), {"perm": perm})


class MayChangeMembers(BasePermission):
    """Checked on the group (so a missing one is a 404 first): adding members needs the view's
    ``member_perms["add"]``, removing them (DELETE) its ``member_perms["delete"]``."""

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        perm: str = view.member_perms["delete" if request.method == "DELETE" else "add"]
        if request.user.has_perm(perm):
            return True
        raise PermissionDenied(f"Changing members needs the {perm} permission.")


class ActionPermissions:
    """A viewset mixin: ``permission_classes`` for every action, plus the action's own from
    ``action_permissions`` (``"*"``: those of any action not listed, such as OPTIONS)."""

    action_permissions: ClassVar[dict[str, list[type[BasePermission]]]] = {}

    def get_permissions(self) -> list[BasePermission]:
        base: list[BasePermission] = super().get_permissions()  # type: ignore[misc]
        declared = self.action_permissions
        action = getattr(self, "action", None) or ""
        extra = declared.get(action, declared.get("*", []))
        return [*base, *(permission() for permission in extra)]
