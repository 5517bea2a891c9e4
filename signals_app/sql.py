"""The pipeline's set-based writes, in the SQL of each supported database.

PostgreSQL gets whole batches as arrays through ``unnest`` (one statement, one parameter
per column); SQLite, the embedded default, gets multi-row VALUES. Both are upserts that
add to what is there, which the ORM's bulk_create(update_conflicts=...) cannot express.

Every value reaches the database through psycopg's adaptation (lists become typed arrays):
never a literal written by hand. PostgreSQL reads an unquoted ``null`` inside an array
literal as NULL, which once stalled every batch holding a signal of kind ``null``.

Communities and cohorts go through the same statements: each group class names its members
and aggregates (``community.groups``), whose tables and group keys, like the signal's lists of
the groups it was credited to, come from the models' ``_meta``, quoted by psycopg as
identifiers. The columns the twins share are those of their abstract bases.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connection, models
from psycopg import sql

from community.groups import GroupAggregate, MemberGroup
from community.models import Cohort, Community

from .models import Outcome, Signal, hour_bucket

# SQLite allows 32,766 parameters a statement; stay well under it.
_SQLITE_ROWS_PER_STATEMENT = 2000

# (target id, hour, item id, kind) -> [count, weight sum, last time]
AggregateKey = tuple[int, datetime, int, str]
Increments = dict[AggregateKey, list[Any]]


def quoted(name: str) -> str:
    """A table or column name of the models, quoted as an SQL identifier."""
    return sql.Identifier(name).as_string()


def _table(model: type[models.Model]) -> str:
    return quoted(model._meta.db_table)


def credited_column(aggregates: type[GroupAggregate]) -> str:
    """The column of the signal's list of the groups of ``aggregates``' kind it was credited to."""
    return cast("models.Field[Any, Any]", Signal._meta.get_field(aggregates.credited_field)).column


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
    table = _table(Signal)
    with _cursor() as cursor:
        if _postgresql():
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


_HOUR_SQL = "date_trunc('hour', {} AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"  # hour_bucket, in SQL


@functools.cache  # built once, on first use (the models' table names)
def _credit_sql() -> str:
    """One statement: the membership joins, both aggregate upserts, the outcomes.

    Data-modifying CTEs run in an order of the database's choosing unless one waits for
    another; here each waits for the one before (an uncorrelated scalar subquery over it runs
    first), so rows are locked table by table in a fixed order: cohorts, communities, then
    the signals (as an erasure does, signals_app.erasure), and, within a table, in key order.
    Two workers, or a worker and an erasure, cannot deadlock each other.
    """
    signal = _table(Signal)

    def credited(name: str, group_class: type[MemberGroup], ids: str) -> str:
        members = group_class.members_model
        return (
            f"{name} AS (SELECT s.id, m.{quoted(members.group_column())} AS target, s.item_id, s.kind, s.weight,"  # noqa: S608
            f" s.occurred_at FROM {signal} s JOIN {_table(members)} m ON m.user_id = s.user_id"
            f" WHERE s.id = ANY(%({ids})s::bigint[]))"
        )

    def upsert(name: str, group_class: type[MemberGroup], source: str, after: str) -> str:
        aggregates = group_class.aggregate_model
        target = quoted(aggregates.group_column())
        return (
            f"{name} AS (INSERT INTO {_table(aggregates)} AS a ({target}, hour, item_id, kind, count, weight_sum,"  # noqa: S608
            f" last_at) SELECT target, {_HOUR_SQL.format('occurred_at')}, item_id, kind, count(*), sum(weight),"
            f" max(occurred_at) FROM {source} WHERE {after} GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
            f" ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = a.count + excluded.count,"
            " weight_sum = a.weight_sum + excluded.weight_sum, last_at = GREATEST(a.last_at, excluded.last_at)"
            " RETURNING 1)"
        )

    credited_communities = quoted(credited_column(Community.aggregate_model))
    credited_cohorts = quoted(credited_column(Cohort.aggregate_model))
    return (
        "WITH "  # noqa: S608 - tables are ours, values are parameters
        + ", ".join(
            [
                credited("to_communities", Community, "communities"),
                credited("to_cohorts", Cohort, "cohorts"),
                upsert("attributed", Cohort, "to_cohorts", "true"),
                upsert("forwarded", Community, "to_communities", "(SELECT count(*) FROM attributed) >= 0"),
                "credits AS (SELECT u.id, u.reason, c.targets AS communities, k.targets AS cohorts"
                " FROM unnest(%(ids)s::bigint[], %(reasons)s::smallint[]) AS u(id, reason)"
                " LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM to_communities GROUP BY id)"
                " c USING (id)"
                " LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM to_cohorts GROUP BY id)"
                " k USING (id))",
                f"marked AS (UPDATE {signal} s SET"  # noqa: S608 - tables are ours, values are parameters
                " outcome = CASE WHEN c.reason IS NOT NULL THEN %(gated)s::smallint"
                " WHEN c.communities IS NULL AND c.cohorts IS NULL THEN %(no_target)s::smallint"
                " ELSE %(attributed)s::smallint END,"
                " gated_reason = c.reason,"
                f" {credited_communities} = CASE WHEN c.communities IS NOT NULL OR c.cohorts IS NOT NULL"
                " THEN coalesce(c.communities, '[]'::jsonb) END,"
                f" {credited_cohorts} = CASE WHEN c.communities IS NOT NULL OR c.cohorts IS NOT NULL"
                " THEN coalesce(c.cohorts, '[]'::jsonb) END,"
                " processed_at = %(processed_at)s, fence_at_processing = %(fence)s"
                " FROM credits c WHERE s.id = c.id AND (SELECT count(*) FROM forwarded) >= 0 RETURNING s.outcome)",
            ]
        )
        + " SELECT outcome, count(*) FROM marked GROUP BY outcome"
    )


def credit_and_mark(
    *,
    cohorts: Sequence[int],
    communities: Sequence[int],
    reasons: Mapping[int, int | None],
    processed_at: datetime,
    fence: int,
) -> dict[int, int]:
    """Credit ``cohorts`` (signal ids) to every cohort of their user and ``communities`` to
    every community, and mark every signal of ``reasons`` (id -> gated reason, None where it
    passed the gate) with its outcome and evidence: gated, attributed where it was credited
    anywhere (with the targets), no target otherwise; all processed at ``processed_at``
    behind fence version ``fence``. Returns how many signals got each outcome.

    On PostgreSQL, one statement: the membership joins, both aggregate upserts and the
    outcomes (data-modifying CTEs, one snapshot). Elsewhere, the same in Python.
    """
    if not reasons:
        return {}
    if not _postgresql():
        return _credit_and_mark_in_python(cohorts, communities, reasons, processed_at, fence)
    with _cursor() as cursor:
        cursor.execute(
            _credit_sql(),
            {
                "communities": list(communities),
                "cohorts": list(cohorts),
                "ids": list(reasons),
                "reasons": [None if r is None else int(r) for r in reasons.values()],
                "processed_at": processed_at,
                "fence": fence,
                "gated": int(Outcome.GATED),
                "no_target": int(Outcome.NO_TARGET),
                "attributed": int(Outcome.ATTRIBUTED),
            },
        )
        return dict(cursor.fetchall())


# (signal id, outcome, gated reason, communities credited, cohorts credited)
Mark = tuple[int, int, int | None, Sequence[int] | None, Sequence[int] | None]


def _credit_and_mark_in_python(
    cohorts: Sequence[int],
    communities: Sequence[int],
    reasons: Mapping[int, int | None],
    processed_at: datetime,
    fence: int,
) -> dict[int, int]:
    rows = Signal.objects.filter(id__in=set(cohorts) | set(communities)).values_list(
        "id", "user_id", "item_id", "kind", "weight", "occurred_at"
    )
    signals = {row[0]: row[1:] for row in rows}
    users = {user_id for user_id, *_ in signals.values()}
    credits: dict[int, tuple[list[int], list[int]]] = {signal_id: ([], []) for signal_id in signals}
    for group_class, ids, slot in ((Community, communities, 0), (Cohort, cohorts, 1)):
        members = group_class.members_model
        by_user: dict[int, list[int]] = {}
        for user_id, target_id in members.objects.filter(user_id__in=users).values_list(
            "user_id", members.group_key().attname
        ):
            by_user.setdefault(user_id, []).append(target_id)
        increments: Increments = {}
        for signal_id in ids:
            user_id, item_id, kind, weight, at = signals[signal_id]
            targets = sorted(by_user.get(user_id, ()))
            credits[signal_id][slot].extend(targets)
            for target_id in targets:
                key = (target_id, hour_bucket(at), item_id, kind)
                current = increments.setdefault(key, [0, 0.0, at])
                current[0] += 1
                current[1] += weight
                current[2] = max(current[2], at)
        _add_to_aggregates(group_class.aggregate_model, increments)
    marks: list[Mark] = []
    counts: dict[int, int] = {}
    for signal_id, reason in reasons.items():
        forwarded, attributed = credits.get(signal_id, ([], []))
        mark: Mark
        if reason is not None:
            mark = (signal_id, Outcome.GATED, reason, None, None)
        elif forwarded or attributed:
            mark = (signal_id, Outcome.ATTRIBUTED, None, forwarded, attributed)
        else:
            mark = (signal_id, Outcome.NO_TARGET, None, None, None)
        counts[mark[1]] = counts.get(mark[1], 0) + 1
        marks.append(mark)
    _mark_outcomes(marks, processed_at, fence)
    return counts


def _add_to_aggregates(model: type[GroupAggregate], increments: Increments) -> None:
    """SQLite: add each increment to its (target, hour, item, kind) row, creating missing
    rows, in key order."""
    if not increments:
        return
    table = _table(model)
    target = quoted(model.group_column())
    columns = f"{target}, hour, item_id, kind, count, weight_sum, last_at"
    rows = [(*key, *value) for key, value in sorted(increments.items())]
    with connection.cursor() as cursor:
        for chunk in _chunks(rows, _SQLITE_ROWS_PER_STATEMENT // 7):
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                f"ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = {table}.count + excluded.count, "
                f"weight_sum = {table}.weight_sum + excluded.weight_sum, "
                f"last_at = MAX({table}.last_at, excluded.last_at)",
                _sqlite_params(chunk),
            )


def _json(ids: Sequence[int] | None) -> str | None:
    return None if ids is None else json.dumps(list(ids), separators=(",", ":"))


def _mark_outcomes(
    outcomes: Sequence[Mark],
    processed_at: datetime,
    fence: int,
) -> None:
    """SQLite: each signal's (id, outcome, gated reason, communities, cohorts)."""
    table = _table(Signal)
    credited_communities = quoted(credited_column(Community.aggregate_model))
    credited_cohorts = quoted(credited_column(Cohort.aggregate_model))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET outcome = %s, gated_reason = %s, {credited_communities} = %s, "  # noqa: S608
            f"{credited_cohorts} = %s, processed_at = %s, fence_at_processing = %s WHERE id = %s",
            [
                (o, r, _json(c1), _json(c2), connection.ops.adapt_datetimefield_value(processed_at), fence, i)
                for i, o, r, c1, c2 in outcomes
            ],
        )


_PENDING_COLUMNS = ("id", "user_id", "received_at", "fence_at_receipt")


def lock_pending(signal_ids: Sequence[int]) -> list[tuple[Any, ...]]:
    """Lock the still-pending signals among ``signal_ids``, skipping rows another worker holds.

    Rows are (id, user_id, received_at, fence_at_receipt), by id: what the gate needs.
    """
    if _postgresql():
        with _cursor() as cursor:
            cursor.execute(
                f"SELECT {', '.join(_PENDING_COLUMNS)} FROM {_table(Signal)} "  # noqa: S608
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


# --- erasure ------------------------------------------------------------------------------------

# Cohorts first, as the pipeline adds to them (process_signals): the two lock aggregate rows
# table by table in the same order, or an erasure and a batch could deadlock each other.
_GROUPS_IN_LOCK_ORDER: tuple[type[MemberGroup], ...] = (Cohort, Community)

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
    signals = _table(Signal)
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
        for group_class in _GROUPS_IN_LOCK_ORDER:
            cursor.execute(_subtract_sql(group_class.aggregate_model), params)
            gone, kept = cursor.fetchone()
            rows_changed += gone + kept
        cursor.execute(f"DELETE FROM {signals} WHERE id = ANY(%(ids)s::bigint[])", params)  # noqa: S608
        deleted = cursor.rowcount
    return deleted, rows_changed


def _subtract_sql(aggregates: type[GroupAggregate]) -> str:
    """One statement per aggregate table: the removed signals grouped by row key, the rows
    locked in key order (as the pipeline's upserts lock them: no deadlock between the two),
    rows that fall to zero deleted, the others decremented, and ``last_at`` recomputed from
    the remaining attributed signals only where a removed signal may have been the last.
    The remaining signals of a row are found through the ``signal_attributed_by_item`` index."""
    signals, table = _table(Signal), _table(aggregates)
    target, credited = quoted(aggregates.group_column()), quoted(credited_column(aggregates))
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
    aggregate_models = [group_class.aggregate_model for group_class in _GROUPS_IN_LOCK_ORDER]
    credited_columns = [model.credited_field for model in aggregate_models]
    rows = list(mine.values_list("id", "outcome", "item_id", "kind", "weight", "occurred_at", *credited_columns))
    if not rows:
        return 0, 0
    rows_changed = 0
    for index, model in enumerate(aggregate_models):
        target, credited_column = model.group_key().attname, model.credited_field
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
            row = model._default_manager.filter(**{target: target_id}, hour=hour, item_id=item_id, kind=kind).first()
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
