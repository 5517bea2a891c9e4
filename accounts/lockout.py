"""The answer to a log-in refused because its account and address are locked out."""

from __future__ import annotations

from typing import Any

from axes.helpers import get_cool_off
from django.contrib import admin
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

LOCKED_OUT = (
    "Too many failed log-ins for this account from this address. Try again later, or ask an operator to unlock it."
)


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """429 with ``Retry-After``: JSON in DRF's error shape for the API, a page for the admin."""
    cool_off = get_cool_off(request)
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": LOCKED_OUT}, status=429)
    else:
        context = {**admin.site.each_context(request), "title": "Locked out", "message": LOCKED_OUT}
        response = render(request, "accounts/locked_out.html", context, status=429)
    if cool_off is not None:
        response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response
