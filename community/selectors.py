"""Reads of the community layer."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import NamedTuple

from django.db.models import Count, QuerySet
from django.db.models.functions import TruncDate
from django.utils import timezone

from .cache import CORRUPT
from .membership import CommunityMembership, MembershipStatus, default_active, deserialize_membership
from .models import ChangeAction, CommunityLeave, LeaveHistory, RecordStatus


class LayerStatus(NamedTuple):
    """A user's record as the gate applies it; a corrupt record reads as left."""

    membership: CommunityMembership
    corrupt: bool
    # The clock version of the change a leave or rejoin made (or of the record it kept);
    # status reads leave it out.
    version: int | None = None


def community_layer_status(*, user_id: int) -> LayerStatus:
    """The stored record, or ``default_active`` where there is none.

    Read from the row itself (one primary-key query, the same cost as a fence check),
    so a status answer is always the committed truth.
    """
    value = CommunityLeave.objects.filter(pk=user_id).values_list("value", flat=True).first()
    if value is None:
        return LayerStatus(default_active(user_id), corrupt=False)
    record = deserialize_membership(user_id, value)
    if record is None:
        return LayerStatus(CommunityMembership(user_id, MembershipStatus.LEFT, None), corrupt=True)
    return LayerStatus(record, corrupt=False)


def community_layer_history(*, user_id: int) -> QuerySet[LeaveHistory]:
    """A user's changes, newest first."""
    return LeaveHistory.objects.filter(user_id=user_id).select_related("actor").order_by("-version")


class StoredRecord(NamedTuple):
    """A user's status together with the stored bytes (None where the user never left)."""

    status: LayerStatus
    raw: bytes | None


def community_layer_record(*, user_id: int) -> StoredRecord:
    """Like ``community_layer_status``, with the raw value from the same read (for operators)."""
    value = CommunityLeave.objects.filter(pk=user_id).values_list("value", flat=True).first()
    if value is None:
        return StoredRecord(LayerStatus(default_active(user_id), corrupt=False), raw=None)
    raw = bytes(value)
    record = deserialize_membership(user_id, raw)
    if record is None:
        return StoredRecord(LayerStatus(CommunityMembership(user_id, MembershipStatus.LEFT, None), corrupt=True), raw)
    return StoredRecord(LayerStatus(record, corrupt=False), raw)


class LeaveRecordCounts(NamedTuple):
    active: int
    left: int
    corrupt: int

    @property
    def left_now(self) -> int:
        """Users the gate holds back: left, and corrupt (read as left, fail closed)."""
        return self.left + self.corrupt


def leave_record_counts() -> LeaveRecordCounts:
    """Stored records by status, decoded by the database (one grouped query, no row fetched)."""
    rows = (
        CommunityLeave.objects.annotate(record_status=RecordStatus("value"))
        .values("record_status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    by_status = {row["record_status"]: row["n"] for row in rows}
    return LeaveRecordCounts(
        active=by_status.get(MembershipStatus.ACTIVE, 0),
        left=by_status.get(MembershipStatus.LEFT, 0),
        corrupt=by_status.get(CORRUPT, 0),
    )


class DayChanges(NamedTuple):
    day: date
    leaves: int
    rejoins: int


def leave_changes_per_day(*, days: int = 14, now: datetime | None = None) -> list[DayChanges]:
    """Leaves and rejoins written per day (in the site's time zone), oldest first, today last.

    Counts history rows, so a no-op (leave while left) is not counted: it wrote nothing.
    """
    today = timezone.localdate(now or timezone.now())
    first = today - timedelta(days=days - 1)
    since = timezone.make_aware(datetime.combine(first, time.min))
    rows = (
        LeaveHistory.objects.filter(at__gte=since)
        .annotate(day=TruncDate("at"))
        .values("day", "action")
        .annotate(n=Count("pk"))
        .order_by()
    )
    counts = {(row["day"], row["action"]): row["n"] for row in rows}
    return [
        DayChanges(
            day=day,
            leaves=counts.get((day, ChangeAction.LEAVE.value), 0),
            rejoins=counts.get((day, ChangeAction.REJOIN.value), 0),
        )
        for day in (first + timedelta(days=offset) for offset in range(days))
    ]
