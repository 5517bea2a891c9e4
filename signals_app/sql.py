"""The pipeline's set-based writes, in the SQL of each supported database.

PostgreSQL gets whole batches as arrays through ``unnest`` (one statement, one parameter
per column); SQLite, the embedded default, gets multi-row VALUES. Both are upserts that
add to what is there, which the ORM's bulk_create(update_conflicts=...) cannot express.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from .models import CohortAggregate, CommunityAggregate, Signal

# SQLite allows 32,766 parameters a statement; stay well under it.
_SQLITE_ROWS_PER_STATEMENT = 2000

# (target id, hour, item id, kind) -> [count, weight sum, last time]
AggregateKey = tuple[int, datetime, int, str]
Increments = dict[AggregateKey, list[Any]]


def _sqlite_params(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Flatten rows, with datetimes in the text form Django's SQLite backend stores."""
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(p) if isinstance(p, datetime) else p for row in rows for p in row]


def _chunks(rows: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def insert_signals(sender_id: int, received_at: datetime, rows: Sequence[Sequence[Any]]) -> list[tuple[int, int]]:
    """Insert (user_id, item_id, kind, weight, occurred_at, idempotency_key, outcome) rows.

    A row whose outcome is not pending is marked processed at ``received_at``. A row whose
    idempotency key the sender already used is skipped. Returns (id, outcome) of new rows.
    """
    table = Signal._meta.db_table
    columns = (
        "sender_id, received_at, processed_at, user_id, item_id, kind, weight, occurred_at, idempotency_key, outcome"
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO {table} ({columns}) "  # noqa: S608 - table and columns are ours
                "SELECT %s, %s, CASE WHEN u.outcome = 0 THEN NULL ELSE %s::timestamptz END, u.* "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[], %s::float8[], %s::timestamptz[],"
                " %s::varchar[], %s::smallint[]) AS u(user_id, item_id, kind, weight, occurred_at, key, outcome) "
                "ON CONFLICT DO NOTHING RETURNING id, outcome",
                [sender_id, received_at, received_at, *map(list, zip(*rows, strict=True))],
            )
            return [(r[0], r[1]) for r in cursor.fetchall()]
        inserted: list[tuple[int, int]] = []
        for chunk in _chunks(rows, _SQLITE_ROWS_PER_STATEMENT // len(columns.split(","))):
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            params = _sqlite_params(
                [(sender_id, received_at, None if row[-1] == 0 else received_at, *row) for row in chunk]
            )
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                "ON CONFLICT DO NOTHING RETURNING id, outcome",
                params,
            )
            inserted.extend((r[0], r[1]) for r in cursor.fetchall())
        return inserted


def add_to_aggregates(model: type[CommunityAggregate] | type[CohortAggregate], increments: Increments) -> None:
    """Add each increment to its (target, hour, item, kind) row, creating missing rows.

    Rows are written in key order, so two workers adding to the same rows lock them in the
    same order and cannot deadlock each other.
    """
    if not increments:
        return
    table = model._meta.db_table
    target = "community_id" if model is CommunityAggregate else "cohort_id"
    columns = f"{target}, hour, item_id, kind, count, weight_sum, last_at"
    rows = [(*key, *value) for key, value in sorted(increments.items())]
    conflict = f"ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = {table}.count + excluded.count, "
    conflict += f"weight_sum = {table}.weight_sum + excluded.weight_sum, "
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"INSERT INTO {table} ({columns}) "  # noqa: S608
                "SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::bigint[], %s::varchar[], %s::bigint[],"
                " %s::float8[], %s::timestamptz[]) "
                + conflict
                + f"last_at = GREATEST({table}.last_at, excluded.last_at)",
                list(map(list, zip(*rows, strict=True))),
            )
            return
        for chunk in _chunks(rows, _SQLITE_ROWS_PER_STATEMENT // 7):
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                + conflict
                + f"last_at = MAX({table}.last_at, excluded.last_at)",
                _sqlite_params(chunk),
            )
