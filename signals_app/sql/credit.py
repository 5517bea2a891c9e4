"""Processing's writes: lock the batch, credit both aggregate tables and mark the outcomes in
one statement (PostgreSQL), or the same in Python (SQLite)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from django.db import connection

from community.groups import GroupAggregate, MemberGroup
from community.models import Cohort, Community

from ..models import Outcome, Signal, hour_bucket
from .common import (
    HOUR_SQL,
    SQLITE_ROWS_PER_STATEMENT,
    Increments,
    binding_cursor,
    chunks,
    credited_column,
    on_postgresql,
    quoted,
    sqlite_params,
    table_name,
)


@functools.cache  # built once, on first use (the models' table names)
def _credit_sql() -> str:
    """One statement: the membership joins, both aggregate upserts, the outcomes.

    Data-modifying CTEs run in an order of the database's choosing unless one waits for
    another; here each waits for the one before (an uncorrelated scalar subquery over it runs
    first), so rows are locked table by table in a fixed order: cohorts, communities, then
    the signals (as an erasure does, signals_app.erasure), and, within a table, in key order.
    Two workers, or a worker and an erasure, cannot deadlock each other.

    The groups credited are locked FOR KEY SHARE first, once each, in id order: the aggregate
    tables have no foreign key to their group (a check per new row at commit cost the pipeline
    a tenth of its time each, BENCHMARKS.md). A group being deleted holds its row FOR UPDATE
    (community.groups): the batch waits for it, then finds it gone and credits nothing to it,
    or the deletion waits for the batch and deletes the rows it wrote with the others.
    """
    signal = table_name(Signal)

    def credited(name: str, group_class: type[MemberGroup], ids: str) -> str:
        members = group_class.members_model
        return (
            f"{name}_all AS (SELECT s.id, m.{quoted(members.group_column())} AS target, s.item_id, s.kind, s.weight,"  # noqa: S608
            f" s.occurred_at FROM {signal} s JOIN {table_name(members)} m ON m.user_id = s.user_id"
            f" WHERE s.id = ANY(%({ids})b::bigint[])), "
            f"{name}_groups AS (SELECT id FROM {table_name(group_class)} WHERE id IN (SELECT target FROM {name}_all)"
            " ORDER BY id FOR KEY SHARE), "
            f"{name} AS (SELECT * FROM {name}_all WHERE target IN (SELECT id FROM {name}_groups))"
        )

    def upsert(name: str, group_class: type[MemberGroup], source: str, after: str) -> str:
        aggregates = group_class.aggregate_model
        target = quoted(aggregates.group_column())
        return (
            f"{name} AS (INSERT INTO {table_name(aggregates)} AS a ({target}, hour, item_id, kind, count, weight_sum,"  # noqa: S608
            f" last_at) SELECT target, {HOUR_SQL.format('occurred_at')}, item_id, kind, count(*), sum(weight),"
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
                " FROM unnest(%(ids)b::bigint[], %(reasons)b::smallint[]) AS u(id, reason)"
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
    if not on_postgresql():
        return _credit_and_mark_in_python(cohorts, communities, reasons, processed_at, fence)
    with binding_cursor() as cursor:
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
            user_id, item_id, kind, weight, occurred_at = signals[signal_id]
            targets = sorted(by_user.get(user_id, ()))
            credits[signal_id][slot].extend(targets)
            for target_id in targets:
                key = (target_id, hour_bucket(occurred_at), item_id, kind)
                current = increments.setdefault(key, [0, 0.0, occurred_at])
                current[0] += 1
                current[1] += weight
                current[2] = max(current[2], occurred_at)
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
    table = table_name(model)
    target = quoted(model.group_column())
    columns = f"{target}, hour, item_id, kind, count, weight_sum, last_at"
    rows = [(*key, *value) for key, value in sorted(increments.items())]
    with connection.cursor() as cursor:
        for chunk in chunks(rows, SQLITE_ROWS_PER_STATEMENT // 7):
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({columns}) VALUES {values} "  # noqa: S608
                f"ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = {table}.count + excluded.count, "
                f"weight_sum = {table}.weight_sum + excluded.weight_sum, "
                f"last_at = MAX({table}.last_at, excluded.last_at)",
                sqlite_params(chunk),
            )


def _json(ids: Sequence[int] | None) -> str | None:
    return None if ids is None else json.dumps(list(ids), separators=(",", ":"))


def _mark_outcomes(
    outcomes: Sequence[Mark],
    processed_at: datetime,
    fence: int,
) -> None:
    """SQLite: each signal's (id, outcome, gated reason, communities, cohorts)."""
    table = table_name(Signal)
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


def lock_pending(signal_ids: Sequence[int]) -> list[tuple[int, int, float, int | None]]:
    """Lock the still-pending signals among ``signal_ids``, skipping rows another worker holds.

    Rows are (id, user_id, received_at as seconds since the epoch, fence_at_receipt), by id:
    what the gate needs, and the receipt time only for the queue-age metric. As a number, not
    a datetime: Django's loader parses each timestamp in Python; for 500 rows the statement
    took 2.9 ms with them as timestamps, 1.0 ms as numbers and 0.5 ms without them.
    """
    if on_postgresql():
        with binding_cursor() as cursor:
            cursor.execute(
                "SELECT id, user_id, extract(epoch FROM received_at)::float8, fence_at_receipt "  # noqa: S608
                f"FROM {table_name(Signal)} WHERE id = ANY(%b::bigint[]) AND outcome = 0"
                " ORDER BY id FOR UPDATE SKIP LOCKED",
                [list(signal_ids)],
            )
            locked: list[tuple[int, int, float, int | None]] = cursor.fetchall()
            return locked
    rows = (
        Signal.objects.select_for_update(skip_locked=True)
        .filter(id__in=signal_ids, outcome=0)
        .order_by("id")
        .values_list("id", "user_id", "received_at", "fence_at_receipt")
    )
    return [(signal_id, user_id, received.timestamp(), fence) for signal_id, user_id, received, fence in rows]
