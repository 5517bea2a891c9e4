"""Request and task ids on every log line.

``RequestIdMiddleware`` takes the caller's ``X-Request-ID`` (or makes one), returns it, and
keeps it for the request; ``ContextFilter`` puts it, and the id of the Celery task being
run, on every record, so a leave or a signal can be followed through the logs. Production
writes one JSON object a line (``LOG_FORMAT=json``).
"""

from __future__ import annotations

import contextvars
import logging
import re
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get("X-Request-ID", "")
        rid = given if _SAFE_ID.fullmatch(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-ID"] = rid
        return response


class ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        task_id = None
        try:
            from celery import current_task

            if current_task and current_task.request and current_task.request.id:
                task_id = current_task.request.id
        except Exception:  # noqa: BLE001 - logging must never fail because of context
            task_id = None
        record.task_id = task_id
        return True
