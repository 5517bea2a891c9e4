"""What the leave cache reads from the database: the fence, the gated records, the erased users."""

from __future__ import annotations

import array
import math
import sys
from datetime import UTC, datetime
from typing import Any

from django.db import connections, models
from pyroaring import BitMap64

from ..membership import MembershipStatus
from ..models import ChangeAction, CommunityLeave, LeaveClock, LeaveHistory
from ..record_status import CORRUPT, RecordStatus

_WARM_CHUNK = 1_000_000


def gated_query(using: str) -> Any:
    """The records the gate must hold: LEFT or unreadable (``record_status`` annotated)."""
    return (
        CommunityLeave.objects.using(using)
        .annotate(record_status=RecordStatus("value"))
        .exclude(record_status=MembershipStatus.ACTIVE)
    )


def read_gated(using: str) -> tuple[BitMap64, set[int]]:
    """The gated ids (LEFT or corrupt records) and, apart, the corrupt ones.

    On PostgreSQL, in chunks by primary key, each chunk's ids packed by the database as one
    string of 8-byte integers (``int8send``): unpacked into an array and handed to the
    bitmap whole, so no Python int or tuple is made per id. Elsewhere (SQLite, the embedded
    default) row by row.
    """
    query = gated_query(using).order_by("user_id").values("user_id", "record_status")
    connection = connections[using]
    gated = BitMap64()
    corrupt: set[int] = set()
    if connection.vendor != "postgresql":
        for user_id, status in query.values_list("user_id", "record_status").iterator(chunk_size=10_000):
            gated.add(user_id)
            if status == CORRUPT:
                corrupt.add(user_id)
        return gated, corrupt
    with connection.cursor() as cursor:
        # Chunks by ranges of ids of about _WARM_CHUNK records each (the planner's row
        # estimate), read in whatever order the database finds cheapest: no ORDER BY, no
        # LIMIT, so the scan costs what the floor's does and memory stays bounded.
        table = query.model._meta.db_table
        cursor.execute(
            f"SELECT min(user_id), max(user_id), (SELECT reltuples FROM pg_class WHERE oid = %s::regclass)"  # noqa: S608
            f" FROM {table}",
            [table],
        )
        low, high, estimate = cursor.fetchone()
        if low is None:
            return gated, corrupt
        chunks = max(1, math.ceil(max(estimate or 0, 1) / _WARM_CHUNK))
        width = (high - low) // chunks + 1
        for start in range(low, high + 1, width):
            sql, params = query.filter(user_id__gte=start, user_id__lt=start + width).order_by().query.sql_with_params()
            cursor.execute(
                f"SELECT string_agg(int8send(s.user_id), ''),"  # noqa: S608 - our own query's SQL
                f" array_agg(s.user_id) FILTER (WHERE s.record_status = %s) FROM ({sql}) s",
                [CORRUPT, *params],
            )
            packed, unreadable = cursor.fetchone()
            if packed is None:
                continue
            ids = array.array("Q")
            ids.frombytes(bytes(packed))
            if sys.byteorder == "little":
                ids.byteswap()  # int8send is big-endian
            gated.update(ids)
            corrupt.update(unreadable or ())
    return gated, corrupt


def erased_users(using: str, version: int) -> set[int]:
    """Users erased at or before ``version`` and not active again since (no later change to
    an active record): read through the partial index of erase rows."""
    active_again = (
        LeaveHistory.objects.using(using)
        .annotate(record_status=RecordStatus("value"))
        .filter(
            user_id=models.OuterRef("user_id"),
            version__gt=models.OuterRef("version"),
            version__lte=version,
            record_status=MembershipStatus.ACTIVE,
        )
    )
    erases = LeaveHistory.objects.using(using).filter(action=ChangeAction.ERASE, version__lte=version)
    return set(erases.filter(~models.Exists(active_again)).values_list("user_id", flat=True))


def fingerprint(row: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """A history row's identity, (user_id, at as naive UTC), however the backend returns it."""
    if row is None:
        return (None, None)
    user_id, at = row
    if isinstance(at, datetime) and at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    return (user_id, at)


def fence_sql() -> str:
    return (
        f"SELECT c.version, c.generation, c.epoch, h.user_id, h.at FROM {LeaveClock._meta.db_table} c "  # noqa: S608
        f"LEFT JOIN {LeaveHistory._meta.db_table} h ON h.version = %s WHERE c.id = 1"
    )


def clock_version_sql() -> str:
    """The clock's version alone (the warm's second read)."""
    return f"SELECT version FROM {LeaveClock._meta.db_table} WHERE id = 1"  # noqa: S608
