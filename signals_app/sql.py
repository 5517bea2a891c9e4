"""The pipeline's set-based writes, in the SQL of each supported database.

PostgreSQL gets whole batches as arrays through ``unnest`` (one statement, one parameter
per column); SQLite, the embedded default, gets multi-row VALUES. Both are upserts that
add to what is there, which the ORM's bulk_create(update_conflicts=...) cannot express.

Every value reaches the database through psycopg's adaptation (lists become typed arrays):
never a literal written by hand. PostgreSQL reads an unquoted ``null`` inside an array
literal as NULL, which once stalled every batch holding a signal of kind ``null``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from .models import CohortAggregate, CommunityAggregate, Signal

# SQLite allows 32,766 parameters a statement; stay well under it.
_SQLITE_ROWS_PER_STATEMENT = 2000

# (target id, hour, item id, kind) -> [count, weight sum, last time]
AggregateKey = tuple[int, datetime, int, str]
Increments = dict[AggregateKey, list[Any]]


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def _cursor() -> Any:
    """A cursor for the batch statements. On PostgreSQL one that binds on the server: the
    arrays go as typed parameters dumped by psycopg's C adapters, where Django's default
    client-side binding would quote every element into the query text in Python (about
    30 ms a batch of 500 signals). Same connection, same transaction, Django's execute
    wrappers still apply; no statement is prepared (Django's default), so a pooler in
    transaction mode is fine with it."""
    if not _postgresql():
        return connection.cursor()
    from django.db.backends.postgresql import base  # the psycopg backend (no stubs for its cursors)

    connection.ensure_connection()
    binding_cursor = base.ServerBindingCursor(connection.connection)  # type: ignore[attr-defined]
    return connection._prepare_cursor(binding_cursor)  # type: ignore[attr-defined]


def _sqlite_params(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Flatten rows, with datetimes in the text form Django's SQLite backend stores."""
    adapt = connection.ops.adapt_datetimefield_value
    return [adapt(p) if isinstance(p, datetime) else p for row in rows for p in row]


def _chunks(rows: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows to one list per column (the arrays ``unnest`` takes)."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


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
    table = Signal._meta.db_table
    with _cursor() as cursor:
        if _postgresql():
            cursor.execute(
                f"INSERT INTO {table} ({_INSERT_COLUMNS}) "  # noqa: S608 - table and columns are ours
                "SELECT %s, %s, %s, CASE WHEN u.outcome = 0 THEN NULL ELSE %s::timestamptz END,"
                " CASE WHEN u.outcome = 0 THEN %s::timestamptz END, u.* "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[], %s::float8[], %s::timestamptz[],"
                " %s::varchar[], %s::smallint[], %s::smallint[])"
                " AS u(user_id, item_id, kind, weight, occurred_at, key, outcome, reason) "
                "ON CONFLICT DO NOTHING RETURNING id, outcome",
                [sender_id, received_at, fence, received_at, received_at, *_columns(rows, 8)],
            )
            return [(r[0], r[1]) for r in cursor.fetchall()]
        inserted: list[tuple[int, int]] = []
        width = len(_INSERT_COLUMNS.split(","))
        for chunk in _chunks(rows, _SQLITE_ROWS_PER_STATEMENT // width):
            values = ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * len(chunk))
            params = _sqlite_params(
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
                "ON CONFLICT DO NOTHING RETURNING id, outcome",
                params,
            )
            inserted.extend((r[0], r[1]) for r in cursor.fetchall())
        return inserted


def _target_column(model: type[CommunityAggregate] | type[CohortAggregate]) -> str:
    return "community_id" if model is CommunityAggregate else "cohort_id"


def add_to_aggregates(model: type[CommunityAggregate] | type[CohortAggregate], increments: Increments) -> None:
    """Add each increment to its (target, hour, item, kind) row, creating missing rows.

    Rows are written in key order, so two workers adding to the same rows lock them in the
    same order and cannot deadlock each other.
    """
    if not increments:
        return
    table = model._meta.db_table
    target = _target_column(model)
    columns = f"{target}, hour, item_id, kind, count, weight_sum, last_at"
    rows = [(*key, *value) for key, value in sorted(increments.items())]
    conflict = f"ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = {table}.count + excluded.count, "
    conflict += f"weight_sum = {table}.weight_sum + excluded.weight_sum, "
    with _cursor() as cursor:
        if _postgresql():
            cursor.execute(
                f"INSERT INTO {table} ({columns}) "  # noqa: S608
                "SELECT * FROM unnest(%s::bigint[], %s::timestamptz[], %s::bigint[], %s::varchar[], %s::bigint[],"
                " %s::float8[], %s::timestamptz[]) "
                + conflict
                + f"last_at = GREATEST({table}.last_at, excluded.last_at)",
                _columns(rows, 7),
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


def _json(ids: Sequence[int] | None) -> str | None:
    return None if ids is None else json.dumps(list(ids), separators=(",", ":"))


def mark_outcomes(
    outcomes: Sequence[tuple[int, int, int | None, Sequence[int] | None, Sequence[int] | None]],
    processed_at: datetime,
    fence: int,
) -> None:
    """Write each signal's outcome and evidence: rows of (id, outcome, gated reason,
    communities credited, cohorts credited), all processed at ``processed_at`` and checked
    at fence version ``fence``."""
    if not outcomes:
        return
    table = Signal._meta.db_table
    rows = [(i, o, r, _json(communities), _json(cohorts)) for i, o, r, communities, cohorts in outcomes]
    with _cursor() as cursor:
        if _postgresql():
            cursor.execute(
                f"UPDATE {table} AS s SET outcome = u.outcome, gated_reason = u.reason, "  # noqa: S608
                "credited_communities = u.communities::jsonb, credited_cohorts = u.cohorts::jsonb, "
                "processed_at = %s, fence_at_processing = %s "
                "FROM unnest(%s::bigint[], %s::smallint[], %s::smallint[], %s::text[], %s::text[])"
                " AS u(id, outcome, reason, communities, cohorts) WHERE s.id = u.id",
                [processed_at, fence, *_columns(rows, 5)],
            )
            return
        cursor.executemany(
            f"UPDATE {table} SET outcome = %s, gated_reason = %s, credited_communities = %s, "  # noqa: S608
            "credited_cohorts = %s, processed_at = %s, fence_at_processing = %s WHERE id = %s",
            [
                (o, r, c1, c2, connection.ops.adapt_datetimefield_value(processed_at), fence, i)
                for i, o, r, c1, c2 in rows
            ],
        )


_PENDING_COLUMNS = ("id", "user_id", "item_id", "kind", "weight", "occurred_at", "received_at", "fence_at_receipt")


def lock_pending(signal_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """Lock the still-pending signals among ``signal_ids``, skipping rows another worker holds.

    Rows are (id, user_id, item_id, kind, weight, occurred_at, received_at, fence_at_receipt),
    by id.
    """
    if _postgresql():
        with _cursor() as cursor:
            cursor.execute(
                f"SELECT {', '.join(_PENDING_COLUMNS)} FROM {Signal._meta.db_table} "  # noqa: S608
                "WHERE id = ANY(%s::bigint[]) AND outcome = 0 ORDER BY id FOR UPDATE SKIP LOCKED",
                [list(signal_ids)],
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
    if _postgresql():
        with _cursor() as cursor:
            cursor.execute(
                f"SELECT user_id, {target} FROM {model._meta.db_table} WHERE user_id = ANY(%s::bigint[])",  # noqa: S608
                [list(user_ids)],
            )
            pairs: list[tuple[int, int]] = cursor.fetchall()
            return pairs
    return list(model.objects.filter(user_id__in=list(user_ids)).values_list("user_id", target))


# --- erasure ------------------------------------------------------------------------------------

# Cohorts first, as the pipeline adds to them (process_signals): the two lock aggregate rows
# table by table in the same order, or an erasure and a batch could deadlock each other.
_AGGREGATE_TARGETS: tuple[tuple[type[CommunityAggregate] | type[CohortAggregate], str, str], ...] = (
    (CohortAggregate, "cohort_id", "credited_cohorts"),
    (CommunityAggregate, "community_id", "credited_communities"),
)

# The signals an erasure takes back: the user's, received before the erasure's version (a
# signal stored before receipt fences were recorded has none, and is taken back too).
_TAKEN = "s.user_id = %(user)s AND (s.fence_at_receipt IS NULL OR s.fence_at_receipt < %(before)s)"


def take_back_signals(user_id: int, before: int) -> tuple[int, int]:
    """Take back every signal of ``user_id`` received before fence version ``before``: lock
    them (waiting for a batch in flight that holds any), subtract each attributed one from
    every aggregate row it was credited to, delete the rows that fall to zero, recompute
    ``last_at`` where a removed signal was the last, then delete the signals.

    Runs inside the caller's transaction. Returns (signals deleted, aggregate rows changed).
    """
    if not _postgresql():
        return _take_back_in_python(user_id, before)
    signals = Signal._meta.db_table
    rows_changed = 0
    with connection.cursor() as cursor:
        # FOR UPDATE without SKIP LOCKED: a batch holding some of them commits first, and its
        # outcome is what is read (attributed -> subtracted below). Every later statement works
        # on exactly the rows locked here: under READ COMMITTED each statement sees rows
        # committed since, which another transaction may hold (the settle pass takes those).
        cursor.execute(
            f"SELECT s.id FROM {signals} s WHERE {_TAKEN} ORDER BY s.id FOR UPDATE",  # noqa: S608
            {"user": user_id, "before": before},
        )
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0, 0
        params: dict[str, Any] = {"user": user_id, "before": before, "ids": ids}
        for model, target, credited in _AGGREGATE_TARGETS:
            cursor.execute(_subtract_sql(model._meta.db_table, target, credited), params)
            gone, kept = cursor.fetchone()
            rows_changed += gone + kept
        cursor.execute(f"DELETE FROM {signals} WHERE id = ANY(%(ids)s::bigint[])", params)  # noqa: S608
        deleted = cursor.rowcount
    return deleted, rows_changed


def _subtract_sql(table: str, target: str, credited: str) -> str:
    """One statement per aggregate table: the removed signals grouped by row key, the rows
    locked in key order (as the pipeline's upserts lock them: no deadlock between the two),
    rows that fall to zero deleted, the others decremented, and ``last_at`` recomputed from
    the remaining attributed signals only where a removed signal may have been the last.
    The remaining signals of a row are found through the ``signal_attributed_by_item`` index."""
    signals = Signal._meta.db_table
    return f"""
        WITH removed AS (
            SELECT c.target::bigint AS target,
                   date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
                   s.item_id, s.kind, count(*) AS n, sum(s.weight) AS w, max(s.occurred_at) AS last
            FROM {signals} s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) AS c(target)
            WHERE s.id = ANY(%(ids)s::bigint[]) AND s.outcome = 1
            GROUP BY 1, 2, 3, 4
        ), locked AS (
            SELECT a.id, a.count - r.n AS count, a.weight_sum - r.w AS weight_sum, a.last_at,
                   r.last AS removed_last, r.target, r.hour, r.item_id, r.kind
            FROM {table} a JOIN removed r
              ON a.{target} = r.target AND a.hour = r.hour AND a.item_id = r.item_id AND a.kind = r.kind
            ORDER BY a.{target}, a.hour, a.item_id, a.kind
            FOR UPDATE OF a
        ), gone AS (
            DELETE FROM {table} a USING locked l WHERE a.id = l.id AND l.count <= 0 RETURNING a.id
        ), kept AS (
            UPDATE {table} a SET count = l.count, weight_sum = l.weight_sum,
                   last_at = CASE WHEN l.last_at > l.removed_last THEN l.last_at ELSE coalesce((
                       SELECT max(s.occurred_at) FROM {signals} s
                       WHERE s.outcome = 1 AND s.item_id = l.item_id AND s.kind = l.kind
                         AND s.occurred_at >= l.hour AND s.occurred_at < l.hour + interval '1 hour'
                         AND s.{credited} @> to_jsonb(l.target)
                         AND NOT ({_TAKEN})
                   ), l.last_at) END
            FROM locked l WHERE a.id = l.id AND l.count > 0 RETURNING a.id
        )
        SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM kept)
    """  # noqa: S608 - tables and columns are ours; every value is a parameter


def _take_back_in_python(user_id: int, before: int) -> tuple[int, int]:
    """The embedded default (SQLite, one writer at a time): the same steps through the ORM."""
    from django.db.models import Q

    from .models import Outcome, hour_bucket

    taken = Q(user_id=user_id) & (Q(fence_at_receipt__isnull=True) | Q(fence_at_receipt__lt=before))
    mine = Signal.objects.select_for_update().filter(taken)
    credited_columns = [credited for _model, _target, credited in _AGGREGATE_TARGETS]
    rows = list(mine.values_list("id", "outcome", "item_id", "kind", "weight", "occurred_at", *credited_columns))
    if not rows:
        return 0, 0
    rows_changed = 0
    for index, (model, target, credited_column) in enumerate(_AGGREGATE_TARGETS):
        removed: Increments = {}
        for _id, outcome, item_id, kind, weight, at, *credited in rows:
            if outcome != Outcome.ATTRIBUTED:
                continue
            for target_id in credited[index] or ():
                sums = removed.setdefault((target_id, hour_bucket(at), item_id, kind), [0, 0.0, at])
                sums[0] += 1
                sums[1] += weight
                sums[2] = max(sums[2], at)
        for (target_id, hour, item_id, kind), (n, w, last) in sorted(removed.items()):
            row = model.objects.filter(**{target: target_id}, hour=hour, item_id=item_id, kind=kind).first()
            if row is None:
                continue
            rows_changed += 1
            if row.count - n <= 0:
                row.delete()
                continue
            row.count -= n
            row.weight_sum -= w
            if row.last_at <= last:
                remaining = (
                    Signal.objects.filter(outcome=Outcome.ATTRIBUTED, item_id=item_id, kind=kind)
                    .filter(occurred_at__gte=hour, occurred_at__lt=hour + _ONE_HOUR)
                    .exclude(taken)
                    .values_list("occurred_at", credited_column)
                )
                times = [at for at, targets in remaining if target_id in (targets or ())]
                row.last_at = max(times, default=row.last_at)
            row.save(update_fields=["count", "weight_sum", "last_at"])
    deleted, _ = Signal.objects.filter(taken).delete()
    return deleted, rows_changed


_ONE_HOUR = timedelta(hours=1)
