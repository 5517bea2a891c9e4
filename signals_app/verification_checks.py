"""Proof of the stop-forward promise from stored data alone: signals, history, aggregates.

Four checks, each naming its counterexamples:

1. every attributed signal's user was active at every leave clock version from its receipt
   check (``fence_at_receipt``) to its processing check (``fence_at_processing``), by the
   history: the last change at or before the receipt fence left them active, and no change
   after it up to the processing fence made them left (or unreadable);
2. every gated signal's reason agrees with the history (left at receipt: the record was left
   at the receipt fence; left at processing: at the processing fence; left while queued: a
   change in between made them left). A corrupt record is not in the history and is accepted
   as a reason: gating is always the safe side;
3. every aggregate row equals what the attributed signals credited to it add up to (count,
   weight sum, last time), and every credit has its row;
4. no signal remains that was received before an erasure of its user (an ``erase`` history
   row at a version above its receipt fence; without a receipt fence, any erasure): an
   erasure deletes them all, and with check 3 the aggregates equal what remains.

Each check yields the text of its counterexamples, evaluated by the database over the
signals it is given (``signals_app.verification`` runs them over chunks of ids and counts
them); only counterexamples come back, so memory stays bounded however many signals there are.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce

from community.groups import GroupAggregate
from community.membership import MembershipStatus
from community.models import ChangeAction, LeaveHistory
from community.record_status import RecordStatus

from .models import GatedReason, Outcome, Signal, hour_bucket
from .sql.common import credited_column, quoted

# Weight sums added (or taken back) in another order differ in the last bits: by at most about
# n x 2**-53 x the sum of the weights' sizes. A row passes within the larger of the two bounds.
RELATIVE_TOLERANCE = 1e-9  # of the sum
ORDER_TOLERANCE = 1e-12  # of the sum of |weight| (rows whose weights cancel out)


def _weight_tolerance(expected: float, magnitude: float) -> float:
    return max(RELATIVE_TOLERANCE * max(1.0, abs(expected)), ORDER_TOLERANCE * magnitude)


# --- signals: checks 1, 2 and 4 -----------------------------------------------------------------


def _history_status_at(fence: str) -> Coalesce:
    """The user's record status (0 active, 1 left, -1 corrupt) at the clock version in the
    signal's ``fence`` field: its last change at or before it; active when there is none."""
    last = (
        LeaveHistory.objects.filter(user_id=OuterRef("user_id"), version__lte=OuterRef(fence))
        .order_by("-version")
        .annotate(record_status=RecordStatus("value"))
        .values("record_status")[:1]
    )
    return Coalesce(Subquery(last, output_field=IntegerField()), Value(int(MembershipStatus.ACTIVE)))


def _left_between() -> Exists:
    """A change after the receipt fence, up to the processing fence, that made the user left."""
    return Exists(
        LeaveHistory.objects.annotate(record_status=RecordStatus("value"))
        .exclude(record_status=MembershipStatus.ACTIVE)
        .filter(
            user_id=OuterRef("user_id"),
            version__gt=OuterRef("fence_at_receipt"),
            version__lte=OuterRef("fence_at_processing"),
        )
    )


_LEFT = (int(MembershipStatus.LEFT), -1)


def signal_counterexamples(signals: QuerySet[Signal]) -> Iterator[str]:
    """Checks 1 and 2: the signals among ``signals`` whose outcome or reason the history
    contradicts, in id order."""
    for signal in _contradicted(signals).order_by("id"):
        yield _describe(signal)


def _contradicted(signals: QuerySet[Signal]) -> QuerySet[Signal]:
    checked = signals.filter(outcome__in=[Outcome.ATTRIBUTED, Outcome.GATED], fence_at_receipt__isnull=False)
    annotated = checked.annotate(
        at_receipt=_history_status_at("fence_at_receipt"),
        at_processing=_history_status_at("fence_at_processing"),
        left_between=_left_between(),
    )
    attributed = Q(outcome=Outcome.ATTRIBUTED) & (
        Q(fence_at_processing__isnull=True)
        | Q(credited_communities__isnull=True)
        | Q(credited_cohorts__isnull=True)
        | Q(at_receipt__in=_LEFT)
        | Q(at_processing__in=_LEFT)
        | Q(left_between=True)
    )
    gated = Q(outcome=Outcome.GATED) & (
        Q(gated_reason__isnull=True)
        | (Q(gated_reason=GatedReason.LEFT_AT_RECEIPT) & ~Q(at_receipt__in=_LEFT))
        | (
            Q(gated_reason=GatedReason.LEFT_AT_PROCESSING)
            & (Q(fence_at_processing__isnull=True) | ~Q(at_processing__in=_LEFT))
        )
        | (
            Q(gated_reason=GatedReason.LEFT_WHILE_QUEUED)
            & (Q(fence_at_processing__isnull=True) | Q(left_between=False))
        )
    )
    return annotated.filter(attributed | gated)


def _describe(signal: Any) -> str:
    window = f"fences {signal.fence_at_receipt}..{signal.fence_at_processing}"
    history = f"history: {_STATUS[signal.at_receipt]} at receipt, {_STATUS[signal.at_processing]} at processing"
    if signal.left_between:
        history += ", left in between"
    outcome = Outcome(signal.outcome).label
    if signal.gated_reason is not None:
        outcome += f" ({GatedReason(signal.gated_reason).label})"
    elif signal.outcome == Outcome.GATED:
        outcome += " (no reason recorded)"
    return f"signal {signal.id} of user {signal.user_id}: {outcome}, {window}; {history}"


_STATUS = {0: "active", 1: "left", -1: "corrupt"}


def erasure_survivors(signals: QuerySet[Signal]) -> Iterator[str]:
    """Check 4: the signals among ``signals`` received before an erasure of their user."""
    survivors = signals.filter(_erased_after_receipt()).order_by("id")
    for signal_id, user_id, fence in survivors.values_list("id", "user_id", "fence_at_receipt"):
        yield f"signal {signal_id} of user {user_id} (receipt fence {fence}) survived an erasure"


def _erased_after_receipt() -> Exists:
    """An erasure of the signal's user after its receipt check (any, where it has none)."""
    return Exists(
        LeaveHistory.objects.filter(
            action=ChangeAction.ERASE,
            user_id=OuterRef("user_id"),
            version__gt=Coalesce(OuterRef("fence_at_receipt"), Value(-1)),
        )
    )


# --- aggregates ---------------------------------------------------------------------------------

AggregateModel = type[GroupAggregate]


def aggregate_counterexamples(model: AggregateModel, *, since: datetime | None) -> Iterator[str]:
    """Check 3 for one aggregate table: its rows (the hours from ``since`` on) that differ from
    what the attributed signals credited to them add up to, and the rows missing. A group
    deleted since took its aggregate rows with it: what its signals credited it is not expected."""
    if connection.vendor == "postgresql":
        return _aggregate_mismatches_in_sql(model, since=since)
    return _aggregate_mismatches_in_python(model, since=since)


def aggregate_rows(model: AggregateModel, *, since: datetime | None) -> int:
    """How many rows check 3 compares: the table's, or its hours from ``since`` on."""
    return _stored_rows(model, since=since).count()


def _stored_rows(model: AggregateModel, *, since: datetime | None) -> QuerySet[Any]:
    rows = model._default_manager.all()
    return rows.filter(hour__gte=hour_bucket(since)) if since is not None else rows


def _aggregate_label(model: AggregateModel, key: tuple[Any, ...]) -> str:
    target, hour, item_id, kind = key
    return f"{model.group_field} {target} item {item_id} kind {kind!r} hour {hour:%Y-%m-%d %H:00}"


def _differs(stored: tuple[Any, ...] | None, expected: tuple[Any, ...] | None, magnitude: float) -> bool:
    if stored is None or expected is None:
        return True
    count, weight, last = stored
    want_count, want_weight, want_last = expected
    tolerance = _weight_tolerance(want_weight, magnitude)
    return count != want_count or not math.isclose(weight, want_weight, abs_tol=tolerance) or last != want_last


def _mismatch(model: Any, key: tuple[Any, ...], stored: Any, expected: Any) -> str:
    if expected is None:
        return f"aggregate {_aggregate_label(model, key)}: stored {_sums(stored)}, but no attributed signal"
    if stored is None:
        return f"aggregate {_aggregate_label(model, key)}: missing, its signals add up to {_sums(expected)}"
    return f"aggregate {_aggregate_label(model, key)}: stored {_sums(stored)}, signals add up to {_sums(expected)}"


def _sums(values: tuple[Any, ...]) -> str:
    count, weight, last = values
    return f"count {count}, weight_sum {weight!r}, last_at {last:%Y-%m-%dT%H:%M:%S.%fZ}"


def _aggregate_mismatches_in_sql(model: AggregateModel, *, since: datetime | None) -> Iterator[str]:
    """One grouped pass over the attributed signals joined to the aggregate table; only the
    rows that disagree come back."""
    target, credited = quoted(model.group_column()), quoted(credited_column(model))
    table, signals = quoted(model._meta.db_table), quoted(Signal._meta.db_table)
    groups = quoted(model.group_model()._meta.db_table)
    since_hour = hour_bucket(since) if since is not None else None
    sql = f"""
        WITH expected AS (
            SELECT c.target, date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
                   s.item_id, s.kind, count(*) AS count, sum(s.weight) AS weight_sum, max(s.occurred_at) AS last_at,
                   sum(abs(s.weight)) AS magnitude
            FROM {signals} s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) AS c(target)
            JOIN {groups} g ON g.id = c.target::bigint
            WHERE s.outcome = %s AND (%s::timestamptz IS NULL OR s.occurred_at >= %s::timestamptz)
            GROUP BY 1, 2, 3, 4
        ), stored AS (
            SELECT {target} AS target, hour, item_id, kind, count, weight_sum, last_at FROM {table}
            WHERE (%s::timestamptz IS NULL OR hour >= %s::timestamptz)
        )
        SELECT coalesce(a.target, e.target::bigint), coalesce(a.hour, e.hour), coalesce(a.item_id, e.item_id),
               coalesce(a.kind, e.kind), a.count, a.weight_sum, a.last_at, e.count, e.weight_sum, e.last_at,
               a.target IS NOT NULL
        FROM stored a FULL OUTER JOIN expected e
          ON a.target = e.target::bigint AND a.hour = e.hour AND a.item_id = e.item_id AND a.kind = e.kind
        WHERE a.target IS NULL OR e.target IS NULL OR a.count <> e.count OR a.last_at <> e.last_at
           OR abs(a.weight_sum - e.weight_sum) > greatest(%s * greatest(1.0, abs(e.weight_sum)), %s * e.magnitude)
    """  # noqa: S608 - tables and columns are ours; every value is a parameter
    params = [Outcome.ATTRIBUTED, since_hour, since_hour, since_hour, since_hour, RELATIVE_TOLERANCE, ORDER_TOLERANCE]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row in cursor:
            key = tuple(row[:4])
            stored = tuple(row[4:7]) if row[10] else None
            expected = tuple(row[7:10]) if row[7] is not None else None
            yield _mismatch(model, key, stored, expected)


def _aggregate_mismatches_in_python(model: AggregateModel, *, since: datetime | None) -> Iterator[str]:
    """The embedded default (SQLite): the same comparison, summed in Python."""
    target, credited = model.group_key().attname, model.credited_field
    since_hour = hour_bucket(since) if since is not None else None
    expected: dict[tuple[Any, ...], list[Any]] = {}
    groups = set(model.group_model().objects.values_list("pk", flat=True))
    attributed = Signal.objects.filter(outcome=Outcome.ATTRIBUTED)
    if since_hour is not None:
        attributed = attributed.filter(occurred_at__gte=since_hour)
    for targets, item_id, kind, weight, at in attributed.values_list(
        credited, "item_id", "kind", "weight", "occurred_at"
    ):
        for target_id in set(targets or ()) & groups:
            key = (target_id, hour_bucket(at), item_id, kind)
            sums = expected.setdefault(key, [0, 0.0, at, 0.0])
            sums[0] += 1
            sums[1] += weight
            sums[2] = max(sums[2], at)
            sums[3] += abs(weight)
    rows = _stored_rows(model, since=since)
    for key_and_sums in rows.values_list(target, "hour", "item_id", "kind", "count", "weight_sum", "last_at"):
        key, stored = key_and_sums[:4], key_and_sums[4:]
        want = expected.pop(key, None)
        wanted = tuple(want[:3]) if want else None
        if _differs(stored, wanted, want[3] if want else 0.0):
            yield _mismatch(model, key, stored, wanted)
    for key, want in expected.items():
        yield _mismatch(model, key, None, tuple(want[:3]))
