"""``/health/`` for load balancers (django-health-check): the database, the broker, and the
leave fence. 200 when all pass; 503 otherwise, so a balancer stops sending traffic."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from health_check.base import HealthCheck
from health_check.checks import Database
from health_check.contrib.celery import Ping
from health_check.exceptions import ServiceUnavailable
from health_check.views import HealthCheckView
from kombu import Connection


@dataclasses.dataclass
class LeaveFence(HealthCheck):
    """This process's leave cache can sync with the database (it warms on the first check)."""

    timeout: datetime.timedelta = dataclasses.field(default=datetime.timedelta(seconds=10), repr=False)

    def run(self) -> None:
        from community.cache import leave_gate

        try:
            leave_gate()
        except DatabaseError as exc:
            raise ServiceUnavailable("the leave fence cannot be read") from exc
        finally:
            # Checks run in an executor thread: leave no connection behind in it.
            connection.close()


@dataclasses.dataclass
class Broker(HealthCheck):
    """The Celery broker accepts a connection."""

    timeout: datetime.timedelta = dataclasses.field(default=datetime.timedelta(seconds=3), repr=False)

    def run(self) -> None:
        try:
            with Connection(
                settings.CELERY_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS
            ) as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
        except Exception as exc:
            raise ServiceUnavailable("the broker is unreachable") from exc


class HealthView(HealthCheckView):
    checks: tuple[Any, ...] = (Database, LeaveFence, Broker)

    async def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = await super().get(request, *args, **kwargs)
        if response.status_code == 500:
            response.status_code = 503  # the conventional answer for "take me out of rotation"
        return response


class WorkersHealthView(HealthView):
    """``/health/workers/``: at least one Celery worker answers a ping and consumes the task
    queue. Kept apart from ``/health/``: a web process is not unhealthy because workers are
    down (signals wait, stored, for them)."""

    checks = ((Ping, {"timeout": datetime.timedelta(seconds=2)}),)
