"""Token authentication: knox's, without its scan of the user's other tokens on every request.

knox deletes a user's expired tokens each time one of them authenticates: one more query per
API request, and a read of every token a service account holds. Here a request checks only
the token it presents (an expired one is refused and deleted, as knox does); the others are
deleted by the ``delete_expired_tokens`` sweep (beat, hourly).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.contrib.knox_auth_token import KnoxTokenScheme
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.signals import token_expired


class TokenAuthentication(KnoxTokenAuthentication):
    def _cleanup_token(self, auth_token: Any) -> bool:
        """True when the presented token has expired (it is deleted): knox then refuses it."""
        if auth_token.expiry is None or auth_token.expiry >= timezone.now():
            return False
        username = auth_token.user.get_username()
        auth_token.delete()
        token_expired.send(sender=self.__class__, username=username, source="auth_token")
        return True


class TokenScheme(KnoxTokenScheme):  # type: ignore[no-untyped-call]
    """The same security scheme in the OpenAPI schema as knox's own class has."""

    target_class = "accounts.auth.TokenAuthentication"
