"""Storing a batch of signals as they are received."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..models import Signal
from .common import (
    SQLITE_ROWS_PER_STATEMENT,
    as_columns,
    binding_cursor,
    chunks,
    on_postgresql,
    sqlite_params,
    table_name,
)

# Only a key the sender used before makes a duplicate (the partial unique index on keyed
# signals is the one arbiter): any other conflict, an id already taken, say, is an error that
# rolls the batch back, not a signal silently dropped and counted as a duplicate. It also spares
# each row a probe of the primary key.
_SKIP_DUPLICATES = "ON CONFLICT (sender_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING"
_INSERT_COLUMNS = (
    "sender_id, received_at, fence_at_receipt, processed_at, enqueued_at, "
    "user_id, item_id, kind, weight, occurred_at, idempotency_key, outcome, gated_reason"
)


def insert_signals(
    sender_id: int, received_at: datetime, fence: int, rows: Sequence[Sequence[Any]]
) -> list[tuple[int, int]]:
    """Insert (user_id, item_id, kind, weight, occurred_at, idempotency_key, outcome,
    gated_reason) rows checked at fence version ``fence``.

    A row whose outcome is not pending is marked processed at ``received_at``; a pending one
    is marked enqueued then (its task is sent on commit). A row whose idempotency key the
    sender already used is skipped. Returns (id, outcome) of new rows.
    """
    table = table_name(Signal)
    with binding_cursor() as cursor:
        if on_postgresql():
            cursor.execute(
                f"INSERT INTO {table} ({_INSERT_COLUMNS}) "  # noqa: S608 - table and columns are ours
                "SELECT %s, %s, %s, CASE WHEN u.outcome = 0 THEN NULL ELSE %s::timestamptz END,"
                " CASE WHEN u.outcome = 0 THEN %s::timestamptz END, u.* "
                # The arrays go in binary (%b): psycopg dumps them in C without formatting each
                # element as text, and the server parses none of it (a third of the insert's
                # client time for 1,000 signals, BENCHMARKS.md).
                "FROM unnest(%b::bigint[], %b::bigint[], %b::varchar[], %b::float8[], %b::timestamptz[],"
                " %b::varchar[], %b::smallint[], %b::smallint[])"
                " AS u(user_id, item_id, kind, weight, occurred_at, key, outcome, reason) "
                f"{_SKIP_DUPLICATES} RETURNING id, outcome",
                [sender_id, received_at, fence, received_at, received_at, *as_columns(rows, 8)],
            )
            return [(r[0], r[1]) for r in cursor.fetchall()]
        inserted: list[tuple[int, int]] = []
        width = len(_INSERT_COLUMNS.split(","))
        for chunk in chunks(rows, SQLITE_ROWS_PER_STATEMENT // width):
            values = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(chunk))
            params = sqlite_params(
                [
                    (
                        sender_id,
                        received_at,
                        fence,
                        None if row[6] == 0 else received_at,
                        received_at if row[6] == 0 else None,
                        *row,
                    )
                    for row in chunk
                ]
            )
            cursor.execute(
                f"INSERT INTO {table} ({_INSERT_COLUMNS}) VALUES {values} "  # noqa: S608
                f"{_SKIP_DUPLICATES} RETURNING id, outcome",
                params,
            )
            inserted.extend((r[0], r[1]) for r in cursor.fetchall())
        return inserted
