"""API conventions shared by every app: ids, throttling, and the error shape."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from rest_framework import serializers, status
from rest_framework.exceptions import APIException
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import exception_handler as drf_exception_handler

from community.membership import MAX_USER_ID


class UserIdField(serializers.IntegerField):
    """A user id: an integer from 0 to 2**63-1, given as a JSON integer or a decimal string.

    Stricter than DRF's IntegerField, which also takes ``true``, ``1.0`` and ``" 1 "``.
    """

    default_error_messages = {
        "invalid": "Must be an integer from 0 to 9223372036854775807.",
        "max_value": "Must be at most 9223372036854775807 (2**63-1).",
        "min_value": "Must be at least 0.",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", MAX_USER_ID)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool):
            self.fail("invalid")
        if isinstance(data, str):
            if not (data.isascii() and data.isdigit()) or len(data) > 20:
                self.fail("invalid")
            data = int(data)
        if not isinstance(data, int):
            self.fail("invalid")
        if data < 0:
            self.fail("min_value", min_value=0)
        if data > MAX_USER_ID:
            self.fail("max_value", max_value=MAX_USER_ID)
        return data


def is_service_account(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.groups.filter(name=settings.SERVICE_ACCOUNT_GROUP).exists()
    )


class WriteRateThrottle(UserRateThrottle):
    """Throttles writes only: scope ``write`` per account, ``service_write`` for service accounts."""

    scope = "write"

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        self.scope = "service_write" if is_service_account(request.user) else "write"
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)


class ServiceUnavailable(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The database is unavailable; nothing was changed. Retry shortly."
    default_code = "service_unavailable"


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
    default_code = "payload_too_large"


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus clear answers for an oversized body and an unreachable database."""
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, (OperationalError, InterfaceError)) or type(exc) is DatabaseError:
        # Connection-level failures only: integrity and programming errors stay loud.
        exc = ServiceUnavailable()
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, ServiceUnavailable):
        response["Retry-After"] = "5"
    return response
