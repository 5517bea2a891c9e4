"""API tokens in the admin: listed (never shown: only a hash is stored) and revoked."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from knox.models import AuthToken

from .services import tokens_revoke

admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class AuthTokenAdmin(admin.ModelAdmin[AuthToken]):
    list_display = ("token_key", "user", "created", "expiry", "state")
    list_select_related = ("user",)
    search_fields = ("user__username", "token_key")
    ordering = ("-created",)
    fields = ("token_key", "user", "created", "expiry")
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="state")
    def state(self, obj: AuthToken) -> str:
        return "expired" if obj.expiry is not None and obj.expiry <= timezone.now() else "valid"

    @admin.action(description="Revoke the selected tokens", permissions=["delete"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[AuthToken]) -> None:
        count = tokens_revoke(tokens=queryset)
        self.message_user(request, f"{count} token(s) revoked.", messages.SUCCESS)

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # "Revoke" says what deleting a token does
        return actions

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are issued by log-in or by a command, which show them once

    def has_change_permission(self, request: HttpRequest, obj: AuthToken | None = None) -> bool:
        return False
