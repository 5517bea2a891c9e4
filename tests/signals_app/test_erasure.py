"""Erasure: leave and take back every past contribution, exactly, idempotently, on the record.

The race with a batch in flight runs two real database connections (threads) on PostgreSQL;
the rest runs on either backend.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from community.cache import leave_cache, leave_gate
from community.models import ChangeAction, LeaveClock, LeaveHistory
from community.services.layer import erase_community_layer, leave_community_layer, rejoin_community_layer
from signals_app.erasure import erasures_settle, user_erase
from signals_app.models import CohortAggregate, CommunityAggregate, Signal
from signals_app.services.ingest import _drop_if_erased_meanwhile, signals_ingest
from signals_app.services.processing import signals_process
from signals_app.verification import verify_stop_forward
from tests.factories import UserFactory
from tests.helpers import HOUR, batch_held_open, in_thread, ingest, join, sig

pytestmark = pytest.mark.django_db

GONE, STAYS = 301, 302
ONLY_POSTGRESQL = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks across two connections: PostgreSQL"
)


def rows(model: Any) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    target = "community_id" if model is CommunityAggregate else "cohort_id"
    return {
        (r[0], r[1], r[2]): (r[3], r[4], r[5])
        for r in model.objects.values_list(target, "item_id", "kind", "count", "weight_sum", "last_at")
    }


def verified() -> Any:
    result = verify_stop_forward(progress=False)
    assert result.passed, result.named
    return result


@pytest.fixture
def contributions(sender, community, community2, cohort) -> dict[str, Any]:
    """GONE in two communities and a cohort, STAYS in the first community and the cohort;
    both on item 1 (GONE's signal the later one), GONE alone on item 2. All processed."""
    join(GONE, community, community2, cohort)
    join(STAYS, community, cohort)
    ids = ingest(
        sender,
        sig(GONE, item_id=1, weight=2, at=HOUR + timedelta(minutes=50)),
        sig(GONE, item_id=1, weight=3, at=HOUR + timedelta(minutes=40)),
        sig(GONE, item_id=2, weight=1, at=HOUR + timedelta(minutes=5)),
        sig(STAYS, item_id=1, weight=7, at=HOUR + timedelta(minutes=20)),
        sig(STAYS, item_id=1, weight=1, at=HOUR + timedelta(minutes=10)),
    )
    signals_process(signal_ids=ids)
    return {"community": community, "community2": community2, "cohort": cohort}


def test_an_erasure_takes_back_exactly_what_the_user_added(contributions) -> None:
    c1, c2, k = contributions["community"], contributions["community2"], contributions["cohort"]
    clock_before = LeaveClock.objects.get().version
    receipt = user_erase(user_id=GONE)

    stays_last = HOUR + timedelta(minutes=20)
    # Item 1: only STAYS's two signals remain, and last_at falls back to STAYS's latest one.
    assert rows(CommunityAggregate) == {(c1.pk, 1, "view"): (2, 8.0, stays_last)}
    assert rows(CohortAggregate) == {(k.pk, 1, "view"): (2, 8.0, stays_last)}
    assert not CommunityAggregate.objects.filter(community=c2).exists()  # fell to zero: gone
    assert not Signal.objects.filter(user_id=GONE).exists()
    assert Signal.objects.filter(user_id=STAYS).count() == 2
    # 3 signals; rows: c1 item 1 (kept), c1 item 2, c2 items 1 and 2, cohort items 1 and 2.
    assert (receipt.signals_removed, receipt.aggregate_rows_changed, receipt.already_erased) == (3, 6, False)
    assert receipt.version == clock_before + 1
    entry = LeaveHistory.objects.get(version=receipt.version)
    assert (entry.user_id, entry.action, entry.signals_removed, entry.aggregate_rows_changed) == (
        GONE,
        ChangeAction.ERASE,
        3,
        6,
    )
    assert leave_gate().is_left(GONE)
    verified()


def test_erasing_again_changes_nothing_and_says_so(contributions) -> None:
    first = user_erase(user_id=GONE)
    before = (LeaveClock.objects.get().version, LeaveHistory.objects.count(), rows(CommunityAggregate))
    again = user_erase(user_id=GONE)
    assert again.already_erased
    assert (again.version, again.signals_removed, again.aggregate_rows_changed) == (first.version, 3, 6)
    assert (LeaveClock.objects.get().version, LeaveHistory.objects.count(), rows(CommunityAggregate)) == before


def test_erasing_a_user_already_left_writes_its_own_receipt(contributions) -> None:
    left = leave_community_layer(user_id=GONE)
    receipt = user_erase(user_id=GONE)
    assert receipt.version == left.version + 1
    assert receipt.membership.left_at_ns == left.membership.left_at_ns  # the first left_at is kept
    assert receipt.signals_removed == 3


def test_an_unknown_user_is_erased_with_zero_counts() -> None:
    receipt = user_erase(user_id=999_999)
    assert (receipt.signals_removed, receipt.aggregate_rows_changed, receipt.already_erased) == (0, 0, False)
    assert LeaveHistory.objects.get(version=receipt.version).action == ChangeAction.ERASE
    assert leave_gate().is_left(999_999)


def test_an_erased_users_new_signals_are_suppressed_until_a_rejoin(sender, contributions) -> None:
    user_erase(user_id=GONE)
    result = signals_ingest(sender=sender, signals=[sig(GONE), sig(GONE, item_id=5), sig(STAYS, item_id=5)])
    assert (result.accepted, result.duplicates, result.suppressed) == (1, 0, 2)
    assert not Signal.objects.filter(user_id=GONE).exists()
    # A leave while erased and left keeps them erased; a rejoin ends it.
    leave_community_layer(user_id=GONE)
    assert signals_ingest(sender=sender, signals=[sig(GONE)]).suppressed == 1
    rejoin_community_layer(user_id=GONE)
    result = signals_ingest(sender=sender, signals=[sig(GONE)])
    assert (result.accepted, result.suppressed) == (1, 0)
    verified()


def test_a_fresh_process_knows_who_is_erased(sender, contributions) -> None:
    user_erase(user_id=GONE)
    leave_community_layer(user_id=STAYS)
    leave_cache.reset()  # a new process: warms from the records and history
    gate = leave_gate()
    assert gate.is_erased(GONE) and not gate.is_erased(STAYS) and gate.is_left(STAYS)
    rejoin_community_layer(user_id=GONE)
    leave_cache.reset()
    assert not leave_gate().is_erased(GONE)


def test_a_pending_signal_received_before_the_erasure_is_deleted_at_processing(sender, contributions) -> None:
    """The leftover rule: a signal stored by an ingest concurrent with the erasure (so the
    erasure could not see it) is deleted when processed, and nothing is subtracted."""
    receipt = user_erase(user_id=GONE)
    before = rows(CommunityAggregate)
    straggler = Signal.objects.create(
        sender=sender, user_id=GONE, item_id=1, kind="view", occurred_at=HOUR, fence_at_receipt=receipt.version - 1
    )
    report = signals_process(signal_ids=[straggler.pk])
    assert (report.erased, report.gated, report.attributed) == (1, 0, 0)
    assert not Signal.objects.filter(user_id=GONE).exists()
    assert rows(CommunityAggregate) == before
    verified()


def test_gated_signals_stored_by_an_ingest_concurrent_with_the_erasure_are_dropped_after_it(sender) -> None:
    leave_community_layer(user_id=GONE)
    ids = ingest(sender, sig(GONE))  # stored gated at receipt: never processed
    erase_community_layer(user_id=GONE)  # an erasure the ingest did not see (nothing taken back)
    _drop_if_erased_meanwhile(ids, {GONE})
    assert not Signal.objects.filter(user_id=GONE).exists()


def test_the_sweep_settles_what_an_erasure_could_not_see(sender, contributions) -> None:
    """A straggler whose user rejoined before it was processed is gated, not deleted, by the
    worker: the verifier names it, and the sweep's settle pass removes it."""
    receipt = user_erase(user_id=GONE)
    straggler = Signal.objects.create(
        sender=sender, user_id=GONE, item_id=1, kind="view", occurred_at=HOUR, fence_at_receipt=receipt.version - 1
    )
    rejoin_community_layer(user_id=GONE)
    assert signals_process(signal_ids=[straggler.pk]).gated == 1
    result = verify_stop_forward(progress=False)
    assert result.erased_remaining == 1 and not result.passed
    assert erasures_settle() == 1
    entry = LeaveHistory.objects.get(version=receipt.version)
    assert entry.signals_removed == 4  # the receipt counts the straggler too
    verified()


def test_the_command_erases_a_list(contributions, capsys) -> None:
    call_command("erase_users", str(GONE), "424242")
    out = capsys.readouterr().out
    assert f"user {GONE}: erase v" in out and "signals removed 3" in out and "user 424242" in out
    call_command("erase_users", str(GONE))
    assert "already erased" in capsys.readouterr().out


def test_the_command_names_a_bad_id() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"user id #2 '-3'"):
        call_command("erase_users", "1", "-3")
    assert not LeaveHistory.objects.exists()


# --- the API ------------------------------------------------------------------------------------


def url(user_id: Any) -> str:
    return f"/api/community-layer/{user_id}/erase/"


def test_a_user_may_erase_themselves(api, contributions) -> None:
    me = UserFactory()
    api.force_authenticate(me)
    answer = api.post(url(me.pk))
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["user_id"] == me.pk and body["action"] == "erase" and body["status"] == "left"
    assert (body["signals_removed"], body["aggregate_rows_changed"], body["already_erased"]) == (0, 0, False)
    assert body["actor"] == me.username and body["source"] == "api"
    history = api.get(f"/api/community-layer/{me.pk}/history/").json()["results"][0]
    assert (history["action"], history["version"], history["signals_removed"]) == ("erase", body["version"], 0)
    assert api.post(url(me.pk)).json()["already_erased"] is True


def test_erasing_someone_else_needs_the_erase_permission(api, operator, contributions) -> None:
    api.force_authenticate(UserFactory())
    assert api.post(url(GONE)).status_code == 403
    api.force_authenticate(operator)  # may leave and rejoin anyone, but not erase
    answer = api.post(url(GONE))
    assert answer.status_code == 403 and "community.erase_communityleave" in answer.json()["detail"]
    assert Signal.objects.filter(user_id=GONE).count() == 3
    api.force_authenticate(UserFactory(perms=["community.erase_communityleave"]))
    body = api.post(url(GONE)).json()
    assert (body["signals_removed"], body["aggregate_rows_changed"]) == (3, 6)


def test_anonymous_gets_401(api) -> None:
    assert api.post(url(1)).status_code == 401


@pytest.mark.parametrize("bad", ["-1", "abc", "1.0", "99999999999999999999", "%20"])
def test_a_bad_id_is_a_400_naming_the_rule(api, superuser, bad) -> None:
    api.force_authenticate(superuser)
    answer = api.post(url(bad))
    assert answer.status_code == 400
    assert list(answer.json()) == ["user_id"]
    assert "Must be" in answer.json()["user_id"][0]
    assert not LeaveHistory.objects.exists()


def test_the_ingest_answer_counts_suppressed(api, sender, contributions) -> None:
    user_erase(user_id=GONE)
    api.force_authenticate(sender)
    answer = api.post("/api/signals/", {"signals": [{"user_id": GONE, "item_id": 1, "kind": "view"}]}, format="json")
    assert answer.status_code == 202
    assert answer.json() == {"accepted": 0, "duplicates": 0, "suppressed": 1}


# --- the race with a batch in flight (two connections) --------------------------------------------


@pytest.mark.django_db(transaction=True)
@ONLY_POSTGRESQL
def test_a_batch_in_flight_commits_first_and_is_subtracted(sender, community, cohort) -> None:
    join(GONE, community, cohort)
    join(STAYS, community)
    ids = ingest(sender, sig(GONE, weight=2.0), sig(GONE, item_id=2), sig(STAYS, weight=5.0))
    erased: list[Any] = []
    worker, release = batch_held_open(ids)  # holds the rows, attributed, until commit
    eraser = in_thread(lambda: erased.append(user_erase(user_id=GONE)))
    eraser.join(1.0)
    assert eraser.is_alive(), "the erasure must wait for the batch that holds the user's signals"
    release.set()
    worker.join(30)
    eraser.join(30)
    receipt = erased[0]
    # The batch's outcome was read after it committed: both signals subtracted.
    assert (receipt.signals_removed, receipt.aggregate_rows_changed) == (2, 4)
    assert rows(CommunityAggregate) == {(community.pk, 1, "view"): (1, 5.0, HOUR + timedelta(minutes=10))}
    assert not CohortAggregate.objects.exists()
    assert not Signal.objects.filter(user_id=GONE).exists()
    verified()


@pytest.mark.django_db(transaction=True)
@ONLY_POSTGRESQL
def test_a_signal_the_erasure_could_not_see_and_a_batch_attributed_is_taken_back_before_the_answer(
    sender, community, monkeypatch
) -> None:
    """The worst case: after the erasure read the user's signals and before it committed, an
    ingest stored one more and a batch (whose fence still had the user active) attributed it.
    The settle pass after the commit takes it back, before the answer, on the same receipt."""
    from signals_app import erasure

    join(GONE, community)
    read, release = threading.Event(), threading.Event()
    real = erasure.take_back_signals
    calls: list[int] = []

    def paused_after_the_read(user_id: int, before: int) -> tuple[int, int]:
        result = real(user_id, before)
        calls.append(before)
        if len(calls) == 1:
            read.set()
            release.wait(30)
        return result

    monkeypatch.setattr(erasure, "take_back_signals", paused_after_the_read)
    erased: list[Any] = []
    eraser = in_thread(lambda: erased.append(user_erase(user_id=GONE)))
    assert read.wait(30)
    [straggler] = ingest(sender, sig(GONE, weight=4.0))  # committed; the erasure cannot see it
    assert signals_process(signal_ids=[straggler]).attributed == 1  # its fence: before the erasure
    assert CommunityAggregate.objects.get().count == 1
    release.set()
    eraser.join(30)
    assert len(calls) == 2  # the erasure's own pass and the settle pass
    assert not Signal.objects.filter(user_id=GONE).exists()
    assert not CommunityAggregate.objects.exists()
    assert erased[0].signals_removed == 1
    assert LeaveHistory.objects.get(version=erased[0].version).signals_removed == 1
    verified()


def test_suppression_costs_no_query_per_signal(sender, contributions, django_assert_max_num_queries) -> None:
    user_erase(user_id=GONE)
    leave_gate()
    with django_assert_max_num_queries(3):
        result = signals_ingest(sender=sender, signals=[sig(GONE, item_id=i) for i in range(200)])
    assert result.suppressed == 200
