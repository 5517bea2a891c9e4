"""What a leave record means and how it is shown: one definition for the API, the change feed
and webhooks, the CSV export, the admin and the console.

A record that cannot be decoded is "corrupt" and reads as left (fail closed). No Django or
DRF import: history rows are read through their attributes only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .membership import CommunityMembership, MembershipStatus, deserialize_membership

if TYPE_CHECKING:
    from .models import LeaveHistory

STATUS_FILTERS = ("active", "left", "corrupt")


def rfc3339(left_at_ns: int | None) -> str | None:
    if left_at_ns is None:
        return None
    seconds, nanos = divmod(left_at_ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nanos:09d}Z"


def status_payload(membership: CommunityMembership, *, corrupt: bool = False) -> dict[str, Any]:
    return {
        "user_id": membership.user_id,
        "status": "left" if membership.status == MembershipStatus.LEFT else "active",
        "left_at": rfc3339(membership.left_at_ns),
        "left_at_ns": membership.left_at_ns,
        "corrupt": corrupt,
    }


def record_status_label(membership: CommunityMembership | None) -> str:
    """One label for a decoded record: "active", "left", or "corrupt" where it cannot be read."""
    if membership is None:
        return "corrupt"
    return "left" if membership.status == MembershipStatus.LEFT else "active"


def change_payload(entry: LeaveHistory) -> dict[str, Any]:
    """A history row as the change feed and the webhooks send it (one definition for both).

    ``action`` is the stored ChangeAction value as it is, so a new action flows through
    without code here.
    """
    record = entry.membership
    left_at_ns = None if record is None else record.left_at_ns
    return {
        "version": entry.version,
        "user_id": entry.user_id,
        "action": entry.action,
        "status": record_status_label(record),
        "left_at": rfc3339(left_at_ns),
        "left_at_ns": left_at_ns,
        "at": entry.at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "actor": entry.actor_label or None,
        "source": entry.source,
        "reason": entry.reason,
    }


def record_status_payload(user_id: int, value: bytes | memoryview) -> dict[str, Any]:
    """A stored record as a status answer; a corrupt one reads as left (fail closed)."""
    record = deserialize_membership(user_id, value)
    if record is None:
        return status_payload(CommunityMembership(user_id, MembershipStatus.LEFT, None), corrupt=True)
    return status_payload(record)


def left_at_text(membership: CommunityMembership | None) -> str:
    """The left-at time for people: RFC 3339, "-" when never left, "unreadable" when corrupt."""
    if membership is None:
        return "unreadable"
    return rfc3339(membership.left_at_ns) or "-"


def status_csv(rows: Iterable[tuple[int, bytes]]) -> Iterator[str]:
    """CSV lines of ``(user_id, stored value)`` rows, a header first; a chunk of lines at a time."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["user_id", "status", "left_at", "left_at_ns", "corrupt"])
    for count, (user_id, value) in enumerate(rows, start=1):
        record = deserialize_membership(user_id, value)
        left_at_ns = None if record is None else record.left_at_ns
        writer.writerow(
            [
                user_id,
                "left" if record is None else record_status_label(record),
                rfc3339(left_at_ns) or "",
                "" if left_at_ns is None else left_at_ns,
                "true" if record is None else "false",
            ]
        )
        if count % 1000 == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()
