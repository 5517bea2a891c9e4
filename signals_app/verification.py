"""Proof of the stop-forward promise from stored data alone: signals, history, aggregates.

Three checks, each naming its counterexamples:

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

Signals are read in chunks of ids, with the checks evaluated by the database; only
counterexamples come back, so memory stays bounded however many signals there are.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Count, Exists, IntegerField, Max, Min, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from tqdm import tqdm

from community.membership import MembershipStatus
from community.models import ChangeAction, LeaveHistory
from community.record_status import RecordStatus

from .models import CohortAggregate, CommunityAggregate, GatedReason, Outcome, Signal, hour_bucket

CHUNK = 100_000
_RELATIVE_TOLERANCE = 1e-9  # weight sums added in another order differ in the last bits


@dataclass
class Verification:
    signals_checked: int = 0
    attributed: int = 0
    gated: int = 0
    without_evidence: int = 0  # processed before the evidence was recorded: nothing to prove
    aggregate_rows_checked: int = 0
    erased_remaining: int = 0  # signals received before an erasure of their user (check 4)
    counterexamples: int = 0
    named: list[str] = field(default_factory=list)
    max_named: int = 100

    @property
    def passed(self) -> bool:
        return self.counterexamples == 0

    def add(self, text: str) -> None:
        self.counterexamples += 1
        if len(self.named) < self.max_named:
            self.named.append(text)


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


def _counterexamples(signals: QuerySet[Signal]) -> QuerySet[Signal]:
    """The signals among ``signals`` whose outcome or reason the history contradicts."""
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


def _id_chunks(first: int, last: int, *, progress: bool) -> Iterator[tuple[int, int]]:
    total = max(0, last - first + 1)
    with tqdm(total=total, unit="ids", desc="signals", file=sys.stderr, disable=None if progress else True) as bar:
        for low in range(first, last + 1, CHUNK):
            high = min(low + CHUNK - 1, last)
            yield low, high
            bar.update(high - low + 1)


def verify_stop_forward(*, since: datetime | None = None, progress: bool = True, max_named: int = 100) -> Verification:
    """Check the three promises (module docstring) over every signal, or over those
    processed since ``since`` and the aggregate hours from ``since`` on."""
    result = Verification(max_named=max_named)
    signals = Signal.objects.all()
    if since is not None:
        signals = signals.filter(id__gte=_first_id_since(since))
    bounds = signals.aggregate(first=Min("id"), last=Max("id"))
    if bounds["first"] is not None:
        for low, high in _id_chunks(bounds["first"], bounds["last"], progress=progress):
            chunk = signals.filter(id__gte=low, id__lte=high)
            counts = chunk.aggregate(
                attributed=_count_of(Outcome.ATTRIBUTED),
                gated=_count_of(Outcome.GATED),
                without=_count_of(Outcome.ATTRIBUTED, Outcome.GATED, no_evidence=True),
            )
            result.attributed += counts["attributed"]
            result.gated += counts["gated"]
            result.without_evidence += counts["without"]
            for signal in _counterexamples(chunk).order_by("id"):
                result.add(_describe(signal))
            for signal_id, user_id, fence in (
                chunk.filter(_erased_after_receipt()).order_by("id").values_list("id", "user_id", "fence_at_receipt")
            ):
                result.erased_remaining += 1
                result.add(f"signal {signal_id} of user {user_id} (receipt fence {fence}) survived an erasure")
    result.signals_checked = result.attributed + result.gated
    for model in (CommunityAggregate, CohortAggregate):
        _check_aggregates(model, result, since=since)
    return result


def _erased_after_receipt() -> Exists:
    """An erasure of the signal's user after its receipt check (any, where it has none)."""
    return Exists(
        LeaveHistory.objects.filter(
            action=ChangeAction.ERASE,
            user_id=OuterRef("user_id"),
            version__gt=Coalesce(OuterRef("fence_at_receipt"), Value(-1)),
        )
    )


def _count_of(*outcomes: int, no_evidence: bool = False) -> Count:
    condition = Q(outcome__in=outcomes)
    if no_evidence:
        condition &= Q(fence_at_receipt__isnull=True)
    return Count("id", filter=condition)


def _first_id_since(since: datetime) -> int:
    """The first signal processed (or received gated) at or after ``since``: ids grow with
    time, and the (outcome, processed_at) index finds it without a scan of the table."""
    first = Signal.objects.filter(
        outcome__in=[Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET], processed_at__gte=since
    ).aggregate(first=Min("id"))["first"]
    return first if first is not None else (Signal.objects.aggregate(last=Max("id"))["last"] or 0) + 1


# --- aggregates ---------------------------------------------------------------------------------

_TARGETS = {
    CommunityAggregate: ("community_id", "credited_communities"),
    CohortAggregate: ("cohort_id", "credited_cohorts"),
}


def _check_aggregates(
    model: type[CommunityAggregate] | type[CohortAggregate], result: Verification, *, since: datetime | None
) -> None:
    if connection.vendor == "postgresql":
        _check_aggregates_in_sql(model, result, since=since)
    else:
        _check_aggregates_in_python(model, result, since=since)


def _aggregate_label(model: Any, key: tuple[Any, ...]) -> str:
    target, hour, item_id, kind = key
    name = "community" if model is CommunityAggregate else "cohort"
    return f"{name} {target} item {item_id} kind {kind!r} hour {hour:%Y-%m-%d %H:00}"


def _differs(stored: tuple[Any, ...] | None, expected: tuple[Any, ...] | None) -> bool:
    if stored is None or expected is None:
        return True
    count, weight, last = stored
    want_count, want_weight, want_last = expected
    tolerance = _RELATIVE_TOLERANCE * max(1.0, abs(want_weight))
    return count != want_count or not math.isclose(weight, want_weight, abs_tol=tolerance) or last != want_last


def _report_row(model: Any, key: tuple[Any, ...], stored: Any, expected: Any, result: Verification) -> None:
    if expected is None:
        result.add(f"aggregate {_aggregate_label(model, key)}: stored {_sums(stored)}, but no attributed signal")
    elif stored is None:
        result.add(f"aggregate {_aggregate_label(model, key)}: missing, its signals add up to {_sums(expected)}")
    else:
        result.add(
            f"aggregate {_aggregate_label(model, key)}: stored {_sums(stored)}, signals add up to {_sums(expected)}"
        )


def _sums(values: tuple[Any, ...]) -> str:
    count, weight, last = values
    return f"count {count}, weight_sum {weight:g}, last_at {last:%Y-%m-%dT%H:%M:%S.%fZ}"


def _check_aggregates_in_sql(
    model: type[CommunityAggregate] | type[CohortAggregate], result: Verification, *, since: datetime | None
) -> None:
    """One grouped pass over the attributed signals joined to the aggregate table; only the
    rows that disagree come back."""
    target, credited = _TARGETS[model]
    table, signals = model._meta.db_table, Signal._meta.db_table
    since_hour = hour_bucket(since) if since is not None else None
    sql = f"""
        WITH expected AS (
            SELECT c.target, date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
                   s.item_id, s.kind, count(*) AS count, sum(s.weight) AS weight_sum, max(s.occurred_at) AS last_at
            FROM {signals} s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) AS c(target)
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
           OR abs(a.weight_sum - e.weight_sum) > %s * greatest(1.0, abs(e.weight_sum))
    """  # noqa: S608 - tables and columns are ours; every value is a parameter
    params = [Outcome.ATTRIBUTED, since_hour, since_hour, since_hour, since_hour, _RELATIVE_TOLERANCE]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row in cursor:
            key = tuple(row[:4])
            stored = tuple(row[4:7]) if row[10] else None
            expected = tuple(row[7:10]) if row[7] is not None else None
            _report_row(model, key, stored, expected, result)
    rows = model.objects.all()
    if since_hour is not None:
        rows = rows.filter(hour__gte=since_hour)
    result.aggregate_rows_checked += rows.count()


def _check_aggregates_in_python(
    model: type[CommunityAggregate] | type[CohortAggregate], result: Verification, *, since: datetime | None
) -> None:
    """The embedded default (SQLite): the same comparison, summed in Python."""
    target, credited = _TARGETS[model]
    since_hour = hour_bucket(since) if since is not None else None
    expected: dict[tuple[Any, ...], list[Any]] = {}
    attributed = Signal.objects.filter(outcome=Outcome.ATTRIBUTED)
    if since_hour is not None:
        attributed = attributed.filter(occurred_at__gte=since_hour)
    for targets, item_id, kind, weight, at in attributed.values_list(
        credited, "item_id", "kind", "weight", "occurred_at"
    ):
        for target_id in targets or ():
            key = (target_id, hour_bucket(at), item_id, kind)
            sums = expected.setdefault(key, [0, 0.0, at])
            sums[0] += 1
            sums[1] += weight
            sums[2] = max(sums[2], at)
    rows = model.objects.all()
    if since_hour is not None:
        rows = rows.filter(hour__gte=since_hour)
    for key_and_sums in rows.values_list(target, "hour", "item_id", "kind", "count", "weight_sum", "last_at"):
        key, stored = key_and_sums[:4], key_and_sums[4:]
        result.aggregate_rows_checked += 1
        want = expected.pop(key, None)
        if _differs(stored, tuple(want) if want else None):
            _report_row(model, key, stored, tuple(want) if want else None, result)
    for key, want in expected.items():
        _report_row(model, key, None, tuple(want), result)
