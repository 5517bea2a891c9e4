"""The signal pipeline through its services: ingest, processing with the gate, the sweep.

No Celery worker runs here: processing is called directly with the signal ids. Ingest
enqueues on commit, which a django_db test never reaches unless it asks for it.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from community.cache import leave_gate
from community.models import CommunityLeave
from community.services.layer import leave_community_layer, rejoin_community_layer
from signals_app.models import CohortAggregate, CommunityAggregate, Outcome, Signal
from signals_app.selectors import outcome_summary
from signals_app.services.ingest import signals_ingest
from signals_app.services.processing import Queued, signals_process, try_cohort_attribution, try_community_forwarding
from signals_app.services.sweep import pending_signals_requeue
from signals_app.sql import common as sql
from tests.factories import UserFactory
from tests.helpers import HOUR, backdate, ingest, join, sig
from tidalproject import metrics

pytestmark = pytest.mark.django_db

USER = 101


def aggregates() -> dict[str, list[tuple[Any, ...]]]:
    """Both aggregate tables, whole."""
    columns = ("item_id", "kind", "hour", "count", "weight_sum", "last_at")
    return {
        "community": sorted(CommunityAggregate.objects.values_list("community_id", *columns)),
        "cohort": sorted(CohortAggregate.objects.values_list("cohort_id", *columns)),
    }


def outcomes(ids: list[int]) -> list[Outcome]:
    return [Outcome(o) for o in Signal.objects.filter(id__in=ids).order_by("id").values_list("outcome", flat=True)]


# --- attribution and forwarding ---------------------------------------------------------------


def test_one_signal_counts_once_in_each_community_and_cohort(sender, community, community2, cohort) -> None:
    join(USER, community, community2, cohort)
    at = HOUR + timedelta(minutes=17, seconds=3)
    ids = ingest(sender, sig(USER, item_id=9, kind="like", weight=2.5, at=at))
    report = signals_process(signal_ids=ids)
    assert (report.attributed, report.gated, report.no_target) == (1, 0, 0)
    row = (9, "like", HOUR, 1, 2.5, at)
    assert aggregates() == {
        "community": sorted([(community.pk, *row), (community2.pk, *row)]),
        "cohort": [(cohort.pk, *row)],
    }
    signal = Signal.objects.get(pk=ids[0])
    assert signal.outcome == Outcome.ATTRIBUTED
    assert signal.processed_at is not None


def test_a_member_of_a_cohort_only_is_attributed(sender, cohort) -> None:
    join(USER, cohort)
    ids = ingest(sender, sig(USER))
    signals_process(signal_ids=ids)
    assert outcomes(ids) == [Outcome.ATTRIBUTED]
    assert len(aggregates()["cohort"]) == 1


def test_a_user_without_memberships_is_no_target(sender, community) -> None:
    join(USER + 1, community)
    ids = ingest(sender, sig(USER))
    report = signals_process(signal_ids=ids)
    assert report.no_target == 1
    assert outcomes(ids) == [Outcome.NO_TARGET]
    assert aggregates() == {"community": [], "cohort": []}
    assert Signal.objects.get(pk=ids[0]).processed_at is not None


def test_a_left_user_is_gated_and_no_aggregate_changes(sender, community, cohort) -> None:
    join(USER, community, cohort)
    join(USER + 1, community, cohort)
    signals_process(signal_ids=ingest(sender, sig(USER + 1)))
    before = aggregates()
    leave_community_layer(user_id=USER)
    ids = ingest(sender, sig(USER), sig(USER, item_id=2))
    assert outcomes(ids) == [Outcome.GATED, Outcome.GATED]  # gated on receipt, never queued
    assert signals_process(signal_ids=ids).processed == 0
    assert outcomes(ids) == [Outcome.GATED, Outcome.GATED]
    assert aggregates() == before
    assert Signal.objects.filter(pk__in=ids, processed_at__isnull=True).count() == 0


def test_after_rejoin_new_signals_count_and_gated_ones_stay_gated(sender, community) -> None:
    join(USER, community)
    leave_community_layer(user_id=USER)
    gated = ingest(sender, sig(USER))
    signals_process(signal_ids=gated)
    rejoin_community_layer(user_id=USER)
    fresh = ingest(sender, sig(USER))
    signals_process(signal_ids=gated + fresh)
    signals_process(signal_ids=gated)
    assert outcomes(gated) == [Outcome.GATED]
    assert outcomes(fresh) == [Outcome.ATTRIBUTED]
    assert [row[4] for row in aggregates()["community"]] == [1]


def test_leave_status_is_read_at_processing_not_at_ingest(sender, community) -> None:
    join(USER, community)
    ids = ingest(sender, sig(USER))  # accepted while active
    leave_community_layer(user_id=USER)
    signals_process(signal_ids=ids)
    assert outcomes(ids) == [Outcome.GATED]
    assert aggregates()["community"] == []


def test_a_signal_received_while_left_stays_gated_when_processed_after_rejoin(sender, community) -> None:
    join(USER, community)
    before = aggregates()
    leave_community_layer(user_id=USER)
    ids = ingest(sender, sig(USER))
    rejoin_community_layer(user_id=USER)
    signals_process(signal_ids=ids)
    assert outcomes(ids) == [Outcome.GATED]
    assert aggregates() == before


def test_a_leave_by_another_process_is_seen_by_a_warm_cache(sender, community) -> None:
    # The cache is warm (active) from the first batch; the leave is only in the database.
    join(USER, community)
    signals_process(signal_ids=ingest(sender, sig(USER)))
    leave_community_layer(user_id=USER)
    ids = ingest(sender, sig(USER))
    signals_process(signal_ids=ids)
    assert outcomes(ids) == [Outcome.GATED]


def test_a_corrupt_leave_record_gates_its_user(sender, community) -> None:
    join(USER, community)
    CommunityLeave.objects.create(user_id=USER, value=b"\x07" * 9)
    ids = ingest(sender, sig(USER))
    signals_process(signal_ids=ids)
    assert outcomes(ids) == [Outcome.GATED]


# --- the two gated steps ---------------------------------------------------------------------


@pytest.mark.parametrize("step", [try_cohort_attribution, try_community_forwarding])
def test_each_step_is_gated_at_its_top(step) -> None:
    leave_community_layer(user_id=USER)  # version 1
    leave_community_layer(user_id=USER + 2)  # version 2
    rejoin_community_layer(user_id=USER + 2)  # version 3
    gate = leave_gate()
    batch = Queued(ids=[1, 2, 3, 4], user_ids=[USER, USER + 1, USER + 2, USER + 2], since=[3, 3, 1, 3])
    gate.preload({USER + 2: 1})  # as signals_process does: the history the warm did not see
    # left now; active all along; left and back while queued; active since its receipt
    assert step(gate, batch) == [2, 4]


# --- idempotency -----------------------------------------------------------------------------


def test_processing_twice_changes_nothing(sender, community, cohort) -> None:
    join(USER, community, cohort)
    ids = ingest(sender, *(sig(USER, item_id=i % 3, weight=i) for i in range(10)))
    signals_process(signal_ids=ids)
    after_one = aggregates()
    processed = list(Signal.objects.order_by("id").values_list("id", "outcome", "processed_at"))
    report = signals_process(signal_ids=ids)
    assert report.processed == 0
    assert aggregates() == after_one
    assert list(Signal.objects.order_by("id").values_list("id", "outcome", "processed_at")) == processed


def test_same_key_twice_by_one_sender_is_stored_once(sender) -> None:
    first = signals_ingest(sender=sender, signals=[sig(USER, key="k1")])
    second = signals_ingest(sender=sender, signals=[sig(USER, item_id=2, key="k1")])
    assert (first.accepted, first.duplicates) == (1, 0)
    assert (second.accepted, second.duplicates, second.signal_ids) == (0, 1, [])
    assert list(Signal.objects.values_list("item_id", flat=True)) == [1]


def test_same_key_by_two_senders_is_stored_twice(sender) -> None:
    other = UserFactory()
    signals_ingest(sender=sender, signals=[sig(USER, key="k1")])
    result = signals_ingest(sender=other, signals=[sig(USER, key="k1")])
    assert (result.accepted, result.duplicates) == (1, 0)
    assert Signal.objects.count() == 2


def test_duplicate_keys_inside_one_batch_count_as_duplicates(sender) -> None:
    result = signals_ingest(sender=sender, signals=[sig(USER, key="a"), sig(USER, key="a"), sig(USER, key="b")])
    assert (result.accepted, result.duplicates) == (2, 1)
    assert sorted(Signal.objects.values_list("idempotency_key", flat=True)) == ["a", "b"]


def test_signals_without_a_key_are_never_duplicates(sender) -> None:
    result = signals_ingest(sender=sender, signals=[sig(USER), sig(USER)])
    assert (result.accepted, result.duplicates) == (2, 0)
    assert Signal.objects.filter(idempotency_key__isnull=True).count() == 2


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite draws each new id above the largest one: no collision"
)
def test_only_an_idempotency_key_makes_a_duplicate_not_a_colliding_id(sender) -> None:
    # A row already holding the id the next insert draws (a sequence set back, say, by a
    # restore): that is an error to surface, with nothing stored, not a "duplicate" to drop.
    (taken,) = ingest(sender, sig(USER))
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [Signal._meta.db_table, taken])
    with pytest.raises(IntegrityError):
        signals_ingest(sender=sender, signals=[sig(USER, item_id=2), sig(USER, item_id=3, key="k")])
    assert list(Signal.objects.values_list("id", "item_id")) == [(taken, 1)]


def test_ingest_stores_pending_signals_as_given(sender) -> None:
    at = HOUR + timedelta(minutes=1, microseconds=5)
    (signal_id,) = ingest(sender, sig(USER, item_id=3, kind="share", weight=-0.5, at=at, key="x"))
    s = Signal.objects.get(pk=signal_id)
    assert (s.sender_id, s.user_id, s.item_id, s.kind, s.weight, s.occurred_at, s.idempotency_key) == (
        sender.pk,
        USER,
        3,
        "share",
        -0.5,
        at,
        "x",
    )
    assert (s.outcome, s.processed_at) == (Outcome.PENDING, None)


# --- increments ------------------------------------------------------------------------------


def test_ten_signals_of_one_hour_make_one_row(sender, community) -> None:
    join(USER, community)
    times = [HOUR + timedelta(minutes=m) for m in (5, 59, 0, 30, 12, 45, 1, 2, 3, 4)]
    ids = ingest(sender, *(sig(USER, weight=0.5, at=t) for t in times))
    signals_process(signal_ids=ids)
    assert aggregates()["community"] == [(community.pk, 1, "view", HOUR, 10, 5.0, max(times))]


def test_different_hours_items_and_kinds_make_different_rows(sender, community) -> None:
    join(USER, community)
    early, late = HOUR - timedelta(minutes=1), HOUR + timedelta(minutes=1)
    ids = ingest(sender, sig(USER, at=early), sig(USER, at=late), sig(USER, item_id=2, at=late), sig(USER, kind="like"))
    signals_process(signal_ids=ids)
    rows = {(r[1], r[2], r[3]): r[4] for r in aggregates()["community"]}
    assert rows == {
        (1, "view", HOUR - timedelta(hours=1)): 1,
        (1, "view", HOUR): 1,
        (2, "view", HOUR): 1,
        (1, "like", HOUR): 1,
    }


def test_later_batches_add_to_existing_rows_and_keep_the_latest_time(sender, community) -> None:
    join(USER, community)
    late, early = HOUR + timedelta(minutes=50), HOUR + timedelta(minutes=10)
    signals_process(signal_ids=ingest(sender, sig(USER, weight=2, at=late)))
    signals_process(signal_ids=ingest(sender, sig(USER, weight=3, at=early)))
    assert aggregates()["community"] == [(community.pk, 1, "view", HOUR, 2, 5.0, late)]


# --- cost ------------------------------------------------------------------------------------


def _process_batch_queries(sender: Any, size: int, first_user: int) -> tuple[int, int]:
    """Queries to process ``size`` signals on distinct items, with gated and no-target users among them.

    Returns (queries, aggregate rows written per table).
    """
    from community.services.layer import bulk_leave_community_layer

    users = [first_user + i for i in range(size - 1)]
    ids = ingest(sender, *(sig(u, item_id=u) for u in users), sig(999_999))
    bulk_leave_community_layer(user_ids=[u for u in users if u % 10 == 0])  # after receipt: gated when processed
    with CaptureQueriesContext(connection) as ctx:
        report = signals_process(signal_ids=ids)
    assert report.processed == size and report.gated > 0 and report.no_target == 1
    return len(ctx.captured_queries), report.attributed


def test_a_batch_reports_the_age_of_its_oldest_signal(sender, django_capture_on_commit_callbacks) -> None:
    older, newer = ingest(sender, sig(USER), sig(USER + 1))
    backdate([older], timedelta(minutes=3))
    backdate([newer], timedelta(minutes=1))
    before = _observed(metrics.SIGNAL_AGE_SECONDS)
    with django_capture_on_commit_callbacks(execute=True):
        signals_process(signal_ids=[older, newer])
    count, total = (after - was for after, was in zip(_observed(metrics.SIGNAL_AGE_SECONDS), before, strict=True))
    assert count == 1
    assert 180 <= total < 190


def _observed(histogram: Any) -> tuple[float, float]:
    """(observations, their sum) of a histogram without labels."""
    samples = {s.name: s.value for metric in histogram.collect() for s in metric.samples}
    return samples[f"{histogram._name}_count"], samples[f"{histogram._name}_sum"]


def test_processing_queries_do_not_grow_with_batch_size(sender, community, cohort) -> None:
    from community.services.groups import group_members_add

    users = range(1000, 1600)
    group_members_add(group=community, user_ids=users)
    group_members_add(group=cohort, user_ids=users)
    leave_gate()  # warm, as a worker is before its first batch
    small, small_rows = _process_batch_queries(sender, 50, 1000)
    large, large_rows = _process_batch_queries(sender, 500, 1100)
    if connection.vendor == "sqlite":
        # SQLite gets multi-row VALUES of a bounded size (its parameter limit): one more
        # statement per table for each full chunk, not one per signal.
        per_statement = sql.SQLITE_ROWS_PER_STATEMENT // 7
        extra = 2 * (math.ceil(large_rows / per_statement) - math.ceil(small_rows / per_statement))
        assert large_rows > per_statement  # the case is really exercised
    else:
        extra = 0
    assert large == small + extra


# --- enqueueing and the sweep ------------------------------------------------------------------


def test_ingest_enqueues_its_signals_only_on_commit(sender, enqueued, django_capture_on_commit_callbacks) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        ids = ingest(sender, sig(USER), sig(USER + 1))
        assert enqueued == []
    assert enqueued == [ids]


def test_enqueue_splits_into_batches_of_signal_batch_size(
    sender, enqueued, settings, django_capture_on_commit_callbacks
):
    settings.SIGNAL_BATCH_SIZE = 2
    with django_capture_on_commit_callbacks(execute=True):
        ids = ingest(sender, *(sig(u) for u in range(5)))
    assert enqueued == [ids[0:2], ids[2:4], ids[4:]]


def test_an_unreachable_broker_leaves_signals_pending_for_the_sweep(
    sender, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    from signals_app.tasks import process_signal_batch

    def broker_down(*_: Any, **__: Any) -> None:
        raise BrokerError("connection refused")

    monkeypatch.setattr(process_signal_batch, "apply_async", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        result = signals_ingest(sender=sender, signals=[sig(USER)])
    assert result.accepted == 1
    assert outcomes(result.signal_ids) == [Outcome.PENDING]


def test_requeue_enqueues_only_old_pending_signals(sender, community, enqueued) -> None:
    join(USER, community)
    old_pending = ingest(sender, sig(USER), sig(USER))
    old_processed = ingest(sender, sig(USER))
    signals_process(signal_ids=old_processed)
    backdate(old_pending + old_processed, timedelta(minutes=10))
    ingest(sender, sig(USER))  # pending, but recent
    assert pending_signals_requeue(older_than=timedelta(minutes=5)).enqueued == 2
    assert enqueued == [old_pending]


def test_requeue_respects_its_limit(sender, enqueued) -> None:
    ids = ingest(sender, *(sig(u) for u in range(3)))
    backdate(ids, timedelta(hours=1))
    assert pending_signals_requeue(older_than=timedelta(minutes=5), limit=2).enqueued == 2
    assert enqueued == [ids[:2]]


# --- outcome summary ---------------------------------------------------------------------------


def test_processed_at_is_when_the_batch_ran_not_when_the_signal_occurred(sender, community) -> None:
    join(USER, community)
    ids = ingest(sender, sig(USER), sig(USER + 2))  # attributed, no target; both occurred hours ago
    before = timezone.now()
    signals_process(signal_ids=ids)
    after = timezone.now()
    stamps = list(Signal.objects.filter(pk__in=ids).values_list("processed_at", flat=True))
    assert len(stamps) == 2
    assert all(before <= stamp <= after for stamp in stamps), stamps


def test_outcome_summary_counts_by_outcome_for_the_last_hour_and_day(sender, community) -> None:
    join(USER, community)
    leave_community_layer(user_id=USER + 1)
    signals_process(signal_ids=ingest(sender, sig(USER), sig(USER), sig(USER + 1), sig(USER + 2)))
    yesterday = ingest(sender, sig(USER + 1))
    signals_process(signal_ids=yesterday)
    Signal.objects.filter(pk__in=yesterday).update(processed_at=timezone.now() - timedelta(hours=5))
    ingest(sender, sig(USER))  # pending
    old_pending = ingest(sender, sig(USER))
    Signal.objects.filter(pk__in=old_pending).update(received_at=timezone.now() - timedelta(days=2))
    assert outcome_summary() == {
        "last_hour": {"attributed": 2, "gated": 1, "no_target": 1, "pending": 1, "failed": 0},
        "last_day": {"attributed": 2, "gated": 2, "no_target": 1, "pending": 1, "failed": 0},
    }
