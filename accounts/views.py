from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate
from django.contrib.auth.signals import user_logged_in
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from tidalproject.parsers import JSONParser

from .clientip import client_ip
from .serializers import IssuedTokenSerializer, LogInSerializer
from .services import token_issue


class TokenLoginThrottle(AnonRateThrottle):
    """Token log-ins per client address, by the same address rule as the lockout."""

    scope = "login"

    def get_ident(self, request: Request) -> str:
        return client_ip(request)


class ObtainToken(APIView):
    """POST username and password, get a new expiring API token (shown once)."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = [TokenLoginThrottle]
    parser_classes = [FormParser, MultiPartParser, JSONParser]

    @extend_schema(request=LogInSerializer, responses={200: IssuedTokenSerializer}, auth=[])
    def post(self, request: Request) -> Response:
        given = LogInSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        # The Django request, not DRF's: django-axes marks a locked-out request on it, and its
        # middleware turns that into the lockout answer.
        user = authenticate(
            request._request, username=given.validated_data["username"], password=given.validated_data["password"]
        )
        if user is None:
            raise serializers.ValidationError(
                {"non_field_errors": ["Unable to log in with provided credentials."]}, code="authorization"
            )
        # As a session log-in does (and knox's own LoginView): last_login, axes' access log,
        # and the account's earlier failures from this address are forgiven.
        user_logged_in.send(sender=type(user), request=request._request, user=user)
        instance, token = token_issue(user=user)
        return Response(IssuedTokenSerializer({"token": token, "expiry": instance.expiry}).data)
