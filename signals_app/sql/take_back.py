"""Erasure's write: take a user's signals back from every aggregate row, then delete them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection

from community.groups import GroupAggregate

from ..models import Signal
from .common import (
    GROUPS_IN_LOCK_ORDER,
    Increments,
    credited_column,
    on_postgresql,
    quoted,
    table_name,
)

ONE_HOUR = timedelta(hours=1)

# Subtracting a weight sum loses the low bits of the larger operand: where the operands are
# this many times larger than the result (weights that nearly cancel out), the row's
# weight sum is added up again from its remaining signals instead.
CANCELLATION = 1e5

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
    if not on_postgresql():
        return _take_back_in_python(user_id, before)
    signals = table_name(Signal)
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
        params: dict[str, Any] = {"user": user_id, "before": before, "ids": ids, "cancellation": CANCELLATION}
        for group_class in GROUPS_IN_LOCK_ORDER:
            cursor.execute(_subtract_sql(group_class.aggregate_model), params)
            gone, kept = cursor.fetchone()
            rows_changed += gone + kept
        cursor.execute(f"DELETE FROM {signals} WHERE id = ANY(%(ids)s::bigint[])", params)  # noqa: S608
        deleted = cursor.rowcount
    return deleted, rows_changed


def _subtract_sql(aggregates: type[GroupAggregate]) -> str:
    """One statement per aggregate table: the removed signals grouped by row key, the rows
    locked in key order (as the pipeline's upserts lock them: no deadlock between the two),
    rows that fall to zero deleted, the others decremented, and, from the remaining attributed
    signals, ``last_at`` recomputed only where a removed signal may have been the last and
    ``weight_sum`` only where the subtraction cancels out (CANCELLATION). The remaining
    signals of a row are found through the ``signal_attributed_by_item`` index."""
    signals, table = table_name(Signal), table_name(aggregates)
    target, credited = quoted(aggregates.group_column()), quoted(credited_column(aggregates))
    remaining = f"""FROM {signals} s
                       WHERE s.outcome = 1 AND s.item_id = l.item_id AND s.kind = l.kind
                         AND s.occurred_at >= l.hour AND s.occurred_at < l.hour + interval '1 hour'
                         AND s.{credited} @> to_jsonb(l.target)
                         AND NOT ({_TAKEN})"""
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
                   greatest(abs(a.weight_sum), abs(r.w)) AS operands,
                   r.last AS removed_last, r.target, r.hour, r.item_id, r.kind
            FROM {table} a JOIN removed r
              ON a.{target} = r.target AND a.hour = r.hour AND a.item_id = r.item_id AND a.kind = r.kind
            ORDER BY a.{target}, a.hour, a.item_id, a.kind
            FOR UPDATE OF a
        ), gone AS (
            DELETE FROM {table} a USING locked l WHERE a.id = l.id AND l.count <= 0 RETURNING a.id
        ), kept AS (
            UPDATE {table} a SET count = l.count,
                   weight_sum = CASE WHEN l.operands <= %(cancellation)s * greatest(1.0, abs(l.weight_sum))
                       THEN l.weight_sum ELSE coalesce((SELECT sum(s.weight) {remaining}), 0) END,
                   last_at = CASE WHEN l.last_at > l.removed_last THEN l.last_at ELSE coalesce((
                       SELECT max(s.occurred_at) {remaining}
                   ), l.last_at) END
            FROM locked l WHERE a.id = l.id AND l.count > 0 RETURNING a.id
        )
        SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM kept)
    """  # noqa: S608 - tables and columns are ours; every value is a parameter


def _take_back_in_python(user_id: int, before: int) -> tuple[int, int]:
    """The embedded default (SQLite, one writer at a time): the same steps through the ORM."""
    from django.db.models import Q

    from ..models import Outcome, hour_bucket

    taken = Q(user_id=user_id) & (Q(fence_at_receipt__isnull=True) | Q(fence_at_receipt__lt=before))
    mine = Signal.objects.select_for_update().filter(taken)
    aggregate_models = [group_class.aggregate_model for group_class in GROUPS_IN_LOCK_ORDER]
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
            operands, row.weight_sum = max(abs(row.weight_sum), abs(w)), row.weight_sum - w
            cancels = operands > CANCELLATION * max(1.0, abs(row.weight_sum))
            if row.last_at <= last or cancels:
                candidates = (
                    Signal.objects.filter(outcome=Outcome.ATTRIBUTED, item_id=item_id, kind=kind)
                    .filter(occurred_at__gte=hour, occurred_at__lt=hour + ONE_HOUR)
                    .exclude(taken)
                    .values_list("occurred_at", "weight", credited_column)
                )
                remaining = [(at, weight) for at, weight, targets in candidates if target_id in (targets or ())]
                if row.last_at <= last:
                    row.last_at = max((at for at, _ in remaining), default=row.last_at)
                if cancels:
                    row.weight_sum = sum(weight for _, weight in remaining)
            row.save(update_fields=["count", "weight_sum", "last_at"])
    deleted, _ = Signal.objects.filter(taken).delete()
    return deleted, rows_changed
