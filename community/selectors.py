"""Reads of the community layer."""

from __future__ import annotations

import time as clock_time
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from typing import NamedTuple

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from tidalproject.paging import EXACT_BELOW, estimated_rows

from .membership import CommunityMembership, MembershipStatus, default_active, deserialize_membership
from .models import ChangeAction, CommunityLeave, LeaveClock, LeaveHistory
from .record_status import CORRUPT, RecordStatus

_STATUS_CODES = {"active": MembershipStatus.ACTIVE, "left": MembershipStatus.LEFT, "corrupt": CORRUPT}


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
    # True where ``left`` is the table's estimated size less the exact active and corrupt counts.
    estimated: bool = False

    @property
    def left_now(self) -> int:
        """Users the gate holds back: left, and corrupt (read as left, fail closed)."""
        return self.left + self.corrupt


def leave_record_counts() -> LeaveRecordCounts:
    """Stored records by status, decoded by the database.

    Up to ``EXACT_BELOW`` records (or where there is no estimate): one grouped query. Past it,
    the active (rejoined) and corrupt records are counted on the status index and ``left`` is
    the rest of the planner's estimate of the table: a grouped count would read every record.
    """
    total = estimated_rows(CommunityLeave)
    if total is not None and total >= EXACT_BELOW:
        by_code = {
            code: CommunityLeave.objects.alias(record_status=RecordStatus("value")).filter(record_status=code).count()
            for code in (MembershipStatus.ACTIVE, CORRUPT)
        }
        active, corrupt = by_code[MembershipStatus.ACTIVE], by_code[CORRUPT]
        return LeaveRecordCounts(active=active, left=max(total - active - corrupt, 0), corrupt=corrupt, estimated=True)
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
    One count a day, each a range of the (at, action) index read on its own (an index-only
    scan): grouping two weeks of changes by their truncated date costs more per row.
    """
    today = timezone.localdate(now or timezone.now())
    first = today - timedelta(days=days - 1)
    shown: list[DayChanges] = []
    for day in (first + timedelta(days=offset) for offset in range(days)):
        start = timezone.make_aware(datetime.combine(day, time.min))
        end = timezone.make_aware(datetime.combine(day + timedelta(days=1), time.min))
        counts = LeaveHistory.objects.filter(at__gte=start, at__lt=end).aggregate(
            leaves=Count("action", filter=Q(action=ChangeAction.LEAVE)),
            rejoins=Count("action", filter=Q(action=ChangeAction.REJOIN)),
        )
        shown.append(DayChanges(day=day, leaves=counts["leaves"], rejoins=counts["rejoins"]))
    return shown


# --- downstream: the change feed, lists and exports ----------------------------------------


def leave_clock_version() -> int:
    """The newest committed change's version (0 before the first change)."""
    version = LeaveClock.objects.filter(pk=1).values_list("version", flat=True).first()
    return int(version or 0)


def community_layer_changes(*, after: int, limit: int) -> list[LeaveHistory]:
    """The changes after version ``after``, oldest first, at most ``limit``.

    Gap-free by construction: every writer holds the clock row's lock from taking its
    version until it commits, so version N commits before N+1 is handed out, and any read
    sees a prefix 1..V of the versions with nothing missing.
    """
    return list(LeaveHistory.objects.filter(version__gt=after).order_by("version")[:limit])


def community_layer_changes_wait(*, after: int, timeout: float, poll: float = 0.25) -> int:
    """Wait until a version past ``after`` is committed or ``timeout`` seconds pass.

    Polls the one-row clock (a primary-key read); returns the clock version last read.
    """
    deadline = clock_time.monotonic() + timeout
    while True:
        version = leave_clock_version()
        remaining = deadline - clock_time.monotonic()
        if version > after or remaining <= 0:
            return version
        clock_time.sleep(min(poll, remaining))


def community_layer_records(*, status: str | None = None) -> QuerySet[CommunityLeave]:
    """Stored records, by user id, optionally of one status (active, left, corrupt).

    The status is evaluated in SQL by the codec's rule (RecordStatus). "active" means a
    record whose status is active (a user who rejoined); users who never left have none.
    """
    records = CommunityLeave.objects.order_by("user_id")
    if status is not None:
        records = records.alias(record_status=RecordStatus("value")).filter(record_status=_STATUS_CODES[status])
    return records


def community_layer_record_rows(*, status: str | None = None, chunk: int = 5_000) -> Iterator[tuple[int, bytes]]:
    """``(user_id, value)`` of every record (of a status), in user id order, ``chunk`` at a time.

    Keyset pagination (``user_id > last``), one short query a chunk: memory stays constant
    however many rows there are, and no transaction or server-side cursor is held open
    while a client reads slowly. Rows changed during the read are read as they are when
    their chunk is fetched.
    """
    records = community_layer_records(status=status)
    last = -1
    while True:
        rows = list(records.filter(user_id__gt=last).values_list("user_id", "value")[:chunk])
        for user_id, value in rows:
            yield user_id, bytes(value)
        if len(rows) < chunk:
            return
        last = rows[-1][0]
