"""The pipeline's set-based writes, in the SQL of each supported database.

PostgreSQL gets whole batches as arrays through ``unnest`` (one statement, one parameter
per column); SQLite, the embedded default, gets multi-row VALUES. Both are upserts that
add to what is there, which the ORM's bulk_create(update_conflicts=...) cannot express.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from .models import CohortAggregate, CommunityAggregate, Signal

# SQLite allows 32,766 parameters a statement; stay well under it.
_SQLITE_ROWS_PER_STATEMENT = 2000

# (target id, hour, item id, kind) -> [count, weight sum, last time]
AggregateKey = tuple[int, datetime, int, str]
Increments = dict[AggregateKey, list[Any]]


# Arrays for PostgreSQL written as array literals by str.join: psycopg's own list adapter
# spends ~30 ms a batch of 500 signals in Python on the same values, and `= ANY(array)`
# parses faster than an `IN` list of 500 placeholders. Only values that need no
# quoting go this way: integers, floats (repr), kinds (validated as [a-z0-9_]{1,32}), and
# times as integer microseconds since the epoch, turned back into timestamps in SQL.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_FROM_MICROS = "(timestamptz 'epoch' + {} * interval '1 microsecond')"


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


def _ints(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _floats(values: Iterable[float]) -> str:
    return "{" + ",".join(map(repr, values)) + "}"


def _words(values: Iterable[str]) -> str:
    words = list(values)
    if not all(map(_WORD.fullmatch, words)):
        raise ValueError("an array element needs quoting; only [a-z0-9_] words are written this way")
    return "{" + ",".join(words) + "}"


_WORD = re.compile(r"[a-z0-9_]+")


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
            targets, hours, items, kinds, counts, sums, lasts = zip(*rows, strict=True)
            cursor.execute(
                f"INSERT INTO {table} ({columns}) "  # noqa: S608
                f"SELECT u.target, {_FROM_MICROS.format('u.hour')}, u.item, u.kind, u.count, u.sum,"
                f" {_FROM_MICROS.format('u.last')} "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::varchar[], %s::bigint[], %s::float8[],"
                " %s::bigint[]) AS u(target, hour, item, kind, count, sum, last) "
                + conflict
                + f"last_at = GREATEST({table}.last_at, excluded.last_at)",
                [
                    _ints(targets),
                    _ints(map(_micros, hours)),
                    _ints(items),
                    _words(kinds),
                    _ints(counts),
                    _floats(sums),
                    _ints(map(_micros, lasts)),
                ],
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


def mark_outcomes(outcomes: dict[int, list[int]], processed_at: datetime) -> None:
    """Set each signal's outcome (outcome -> signal ids) and its processing time."""
    table = Signal._meta.db_table
    if connection.vendor == "postgresql":
        ids = [signal_id for group in outcomes.values() for signal_id in group]
        codes = [outcome for outcome, group in outcomes.items() for _ in group]
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS s SET outcome = u.outcome, processed_at = %s "  # noqa: S608
                "FROM unnest(%s::bigint[], %s::smallint[]) AS u(id, outcome) WHERE s.id = u.id",
                [processed_at, _ints(ids), _ints(codes)],
            )
        return
    for outcome, group in outcomes.items():
        if group:
            Signal.objects.filter(id__in=group).update(outcome=outcome, processed_at=processed_at)


_PENDING_COLUMNS = ("id", "user_id", "item_id", "kind", "weight", "occurred_at", "received_at")


def lock_pending(signal_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """Lock the still-pending signals among ``signal_ids``, skipping rows another worker holds.

    Rows are (id, user_id, item_id, kind, weight, occurred_at, received_at), by id.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {', '.join(_PENDING_COLUMNS)} FROM {Signal._meta.db_table} "  # noqa: S608
                "WHERE id = ANY(%s::bigint[]) AND outcome = 0 ORDER BY id FOR UPDATE SKIP LOCKED",
                [_ints(signal_ids)],
            )
            locked: list[tuple[Any, ...]] = cursor.fetchall()
            return locked
    return list(
        Signal.objects.select_for_update(skip_locked=True)
        .filter(id__in=signal_ids, outcome=0)
        .order_by("id")
        .values_list(*_PENDING_COLUMNS)
    )


def select_by_user(model: Any, target: str, user_ids: Iterable[int]) -> list[tuple[int, int]]:
    """(user_id, target id) of the membership ``model`` for ``user_ids``."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT user_id, {target} FROM {model._meta.db_table} WHERE user_id = ANY(%s::bigint[])",  # noqa: S608
                [_ints(user_ids)],
            )
            pairs: list[tuple[int, int]] = cursor.fetchall()
            return pairs
    return list(model.objects.filter(user_id__in=list(user_ids)).values_list("user_id", target))
