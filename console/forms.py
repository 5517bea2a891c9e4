"""What operators type into the console, checked by the API's rules.

Each check either returns the value or tells the operator what is wrong with it (a message
on the next page) and returns None. The bulk leave list is ``community.forms.BulkLeaveForm``,
shared with the erasure upload of signals_app's admin.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest

from community.ids import parse_user_id
from community.models import MAX_REASON_LENGTH

SHOWN_INPUT = 40  # characters of a bad id quoted back


def user_id_or_message(request: HttpRequest, raw: str) -> int | None:
    """The id by the API's rule, or None after telling the operator what is wrong with it."""
    try:
        return parse_user_id(raw.strip())
    except ValueError as exc:
        shown = raw if len(raw) <= SHOWN_INPUT else f"{raw[:SHOWN_INPUT]}…"
        messages.error(request, f"{shown!r} is not a user id: {exc}")
        return None


def reason_or_message(request: HttpRequest) -> str | None:
    """The confirmation's reason box, trimmed as the API trims it, or None (and a message) when
    the API would refuse it: too long, or holding a NUL character."""
    reason = request.POST.get("reason", "").strip()
    if len(reason) > MAX_REASON_LENGTH:
        messages.error(request, f"The reason is {len(reason)} characters; at most {MAX_REASON_LENGTH}.")
        return None
    if "\x00" in reason:
        messages.error(request, "The reason holds a NUL character (U+0000); remove it.")
        return None
    return reason
