"""API conventions shared by every app: pagination, throttling, and the error shape."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from redis.exceptions import RedisError
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.permissions import SAFE_METHODS
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import UserRateThrottle
from rest_framework.views import exception_handler as drf_exception_handler

from tidalproject.roles import is_service_account

logger = logging.getLogger(__name__)


class Pagination(LimitOffsetPagination):
    """``?limit=&offset=``: 50 a page by default, at most 500."""

    default_limit = 50
    max_limit = 500


class WriteRateThrottle(UserRateThrottle):
    """Throttles writes only: scope ``write`` per account, ``service_write`` for service accounts."""

    scope = "write"

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            return True
        self.scope = "service_write" if is_service_account(request.user) else "write"
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError):
            # The counters' cache is down: serve the request rather than fail it. A throttle
            # protects capacity; it is not a promise worth an outage.
            logger.warning("throttle cache unreachable; request let through", exc_info=True)
            return True


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
