"""The leave cache, its fence and the gate, within one process.

Each ``LeaveCache()`` here stands for another process's cache; the same promises across
real OS processes are in test_processes.py.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from community.cache import leave_cache, leave_gate
from community.cache.fence import LeaveCache
from community.membership import MembershipStatus, deserialize_membership
from community.models import CommunityLeave, LeaveClock
from community.record_status import RecordStatus
from community.services.layer import bulk_leave_community_layer, leave_community_layer, rejoin_community_layer
from community.services.rebuild import leave_cache_rewarm_everywhere

pytestmark = pytest.mark.django_db


def test_first_gate_warms_from_the_records() -> None:
    leave_community_layer(user_id=1)
    leave_community_layer(user_id=2)
    rejoin_community_layer(user_id=2)
    cache = LeaveCache()
    assert not cache.warmed
    gate = cache.sync()
    assert cache.warmed and cache.warms == 1
    assert gate.is_left(1) and not gate.is_left(2) and not gate.is_left(3)
    assert (gate.version, gate.generation) == (3, 0)
    assert cache.size == 1  # only gated users are held


def test_fence_is_one_query_when_nothing_changed(django_assert_num_queries) -> None:
    bulk_leave_community_layer(user_ids=range(500))
    cache = LeaveCache()
    cache.sync()
    with django_assert_num_queries(1):
        gate = cache.sync()
    assert gate.is_left(499)


def test_gate_look_up_runs_no_query(django_assert_num_queries) -> None:
    leave_community_layer(user_id=1)
    gate = leave_gate()
    with django_assert_num_queries(0):
        assert [gate.is_left(u) for u in (0, 1, 2)] == [False, True, False]


def test_a_change_reaches_another_cache_at_its_next_sync(django_assert_num_queries) -> None:
    other = LeaveCache()
    assert not other.sync().is_left(7)
    leave_community_layer(user_id=7)
    with django_assert_num_queries(2):  # the clock, then the feed since the last look
        gate = other.sync()
    assert gate.is_left(7) and other.warms == 1 and other.feed_rows == 1
    rejoin_community_layer(user_id=7)
    assert not other.sync().is_left(7)


def test_feed_applies_changes_in_version_order() -> None:
    other = LeaveCache()
    other.sync()
    leave_community_layer(user_id=1)
    rejoin_community_layer(user_id=1)
    leave_community_layer(user_id=1)
    rejoin_community_layer(user_id=1)
    leave_community_layer(user_id=2)
    gate = other.sync()
    assert not gate.is_left(1) and gate.is_left(2)
    assert gate.version == LeaveClock.objects.get(pk=1).version == 5


def test_a_new_generation_rewarms_and_picks_up_rows_written_outside_the_services() -> None:
    other = LeaveCache()
    other.sync()
    CommunityLeave.objects.create(user_id=9, value=b"garbage")  # not through a service: no feed row
    assert not other.sync().is_left(9)  # the fence did not move, so nothing to apply
    leave_cache_rewarm_everywhere()
    gate = other.sync()
    assert other.warms == 2 and gate.is_left(9) and gate.generation == 1


def test_far_behind_rewarms_instead_of_replaying(settings) -> None:
    settings.LEAVE_CACHE_REWARM_AFTER = 3
    other = LeaveCache()
    other.sync()
    bulk_leave_community_layer(user_ids=[1, 2, 3, 4])
    gate = other.sync()
    assert other.warms == 2 and other.feed_rows == 0
    assert all(gate.is_left(u) for u in (1, 2, 3, 4))


@pytest.mark.parametrize("value", [b"", b"\x01", b"\x00" * 8, b"\x00" * 10, b"\x02" + bytes(8), b"\xff" * 9])
def test_corrupt_values_fail_closed(value: bytes) -> None:
    CommunityLeave.objects.create(user_id=3, value=value)
    CommunityLeave.objects.create(user_id=4, value=bytes(9))  # a valid ACTIVE record
    gate = LeaveCache().sync()
    assert gate.is_left(3) and not gate.is_left(4)


def test_missing_clock_fails_closed_with_an_error() -> None:
    cache = LeaveCache()
    cache.sync()
    LeaveClock.objects.all().delete()
    with pytest.raises(DatabaseError, match="migrate"):
        cache.sync()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=12) | st.binary(min_size=9, max_size=9), min_size=1, max_size=40))
def test_sql_record_status_agrees_with_the_codec(values: list[bytes]) -> None:
    """Warming and the admin filter evaluate the record rule in SQL: it must be the codec's."""
    CommunityLeave.objects.all().delete()
    CommunityLeave.objects.bulk_create(CommunityLeave(user_id=i, value=v) for i, v in enumerate(values))
    in_sql = dict(CommunityLeave.objects.annotate(s=RecordStatus("value")).values_list("user_id", "s"))
    for user_id, value in enumerate(values):
        record = deserialize_membership(user_id, value)
        assert in_sql[user_id] == (-1 if record is None else int(record.status))
    gate = LeaveCache().sync()
    for user_id, value in enumerate(values):
        record = deserialize_membership(user_id, value)
        assert gate.is_left(user_id) == (record is None or record.status == MembershipStatus.LEFT)


# --- a clock that cannot move backwards unnoticed ------------------------------------------------


def _restore_to(version: int) -> None:
    """What a restore of a dump taken at ``version`` (or a failover to a replica that had it)
    does to the fence's tables: later history rows are gone and the clock reads ``version``.
    The records are put back as the history says they were."""
    from community.models import LeaveHistory

    LeaveHistory.objects.filter(version__gt=version).delete()
    LeaveClock.objects.filter(pk=1).update(version=version)
    CommunityLeave.objects.all().delete()
    latest: dict[int, bytes] = {}
    for user_id, value in LeaveHistory.objects.order_by("version").values_list("user_id", "value"):
        latest[user_id] = bytes(value)
    CommunityLeave.objects.bulk_create([CommunityLeave(user_id=u, value=v) for u, v in latest.items()])


def test_a_clock_that_went_back_makes_a_process_rewarm_before_it_gates() -> None:
    bulk_leave_community_layer(user_ids=[1, 2])  # versions 1, 2: the dump is taken here
    leave_community_layer(user_id=3)  # 3
    leave_community_layer(user_id=4)  # 4
    process = LeaveCache()
    assert process.sync().version == 4
    _restore_to(2)
    leave_community_layer(user_id=5)  # version 3 again, in the new timeline
    gate = process.sync()
    assert gate.is_left(5) and not gate.is_left(3) and not gate.is_left(4)
    assert process.last_warm_reason == "clock went back from 4 to 3"


def test_a_restored_clock_that_overtook_the_cached_version_is_caught_by_the_history() -> None:
    # The window the issue names: after a restore, enough new leaves that the clock is past
    # the version a process cached before it syncs again. Only the history row at that
    # version (now another change) tells.
    bulk_leave_community_layer(user_ids=[1, 2])
    leave_community_layer(user_id=3)
    process = LeaveCache()
    assert process.sync().version == 3
    _restore_to(2)
    for user_id in (10, 11, 12):  # versions 3, 4, 5 of the new timeline
        leave_community_layer(user_id=user_id)
    gate = process.sync()
    assert all(gate.is_left(u) for u in (10, 11, 12)) and not gate.is_left(3)
    assert process.last_warm_reason == "history at version 3 was rewritten"


def test_a_recreated_clock_row_has_a_new_epoch_and_every_process_rewarms() -> None:
    leave_community_layer(user_id=1)
    process = LeaveCache()
    process.sync()
    epoch = LeaveClock.objects.get().epoch
    LeaveClock.objects.all().delete()
    LeaveClock.objects.create(pk=1, version=1)
    assert LeaveClock.objects.get().epoch != epoch
    process.sync()
    assert process.last_warm_reason == "new clock epoch" and process.warms == 2


@pytest.mark.django_db(transaction=True)
def test_flush_puts_back_a_clock_row_with_a_new_epoch() -> None:
    from django.core.management import call_command

    epoch = LeaveClock.objects.get().epoch
    call_command("flush", "--noinput", verbosity=0)
    clock = LeaveClock.objects.get()
    assert (clock.version, clock.generation) == (0, 0) and clock.epoch != epoch


def test_the_while_queued_check_answers_from_the_feed_and_from_the_history() -> None:
    process = LeaveCache()
    process.sync()  # warmed at version 0
    leave_community_layer(user_id=1)  # 1
    rejoin_community_layer(user_id=1)  # 2
    gate = process.sync()
    assert not gate.is_left(1)
    assert gate.is_left(1, since=0)  # left at version 1, after a receipt at 0
    assert not gate.is_left(1, since=1)  # its leave was at or before the receipt
    later = LeaveCache()
    gate = later.sync()  # warmed at version 2: the feed before it is not in memory
    gate.preload({1: 0})
    assert gate.is_left(1, since=0) and not LeaveCache().sync().is_left(1)


def test_left_among_answers_for_a_batch_as_is_left_does_for_each_signal() -> None:
    CommunityLeave.objects.create(user_id=3, value=b"not a record")  # corrupt: held (fail closed)
    process = LeaveCache()
    process.sync()  # warmed at version 0
    leave_community_layer(user_id=1)  # 1: left now
    leave_community_layer(user_id=2)  # 2
    rejoin_community_layer(user_id=2)  # 3: left while a signal received at 0, 1 or 2 waited
    gate = process.sync()  # the feed: 1 to 3
    users = [1, 1, 2, 2, 2, 3, 4, 4]
    since = [0, 4, 0, 1, 2, 4, 0, 4]
    assert gate.left_among(users, since) == [gate.is_left(u, since=s) for u, s in zip(users, since, strict=True)]
    assert gate.left_among(users, since) == [True, True, True, True, False, True, False, False]
    # A receipt before this process warmed and no history loaded: both refuse to guess.
    later = LeaveCache().sync()
    with pytest.raises(LookupError):
        later.left_among([2], [0])
    later.preload({2: 0, 4: 0})
    assert later.left_among([2, 4], [0, 0]) == [True, False]


@pytest.mark.django_db(transaction=True)
def test_a_worker_child_comes_up_at_once_however_long_the_warm_takes() -> None:
    # Issue 8, failure 4: the warm ran inside worker_process_init, which Celery kills after
    # 4 s. Here the warm cannot finish (the cache's lock is held, as by a slow database):
    # the start-up hook must return at once all the same, and the warm happens after.
    import threading
    import time

    from community.cache import warm_after_worker_fork

    leave_community_layer(user_id=1)
    cache = leave_cache
    cache.reset()
    returned = threading.Event()
    with cache._lock:
        threading.Thread(target=lambda: (warm_after_worker_fork(), returned.set()), daemon=True).start()
        assert returned.wait(5), "worker_process_init waited for the warm"
        assert not cache.warmed
    deadline = time.monotonic() + 10
    while not cache.warmed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.warmed and cache.size == 1


def test_a_change_committed_during_a_warm_is_in_the_version_the_gate_reports(monkeypatch) -> None:
    # Found by verify_stop_forward in the full stop-forward drill: a leave committed between
    # the warm's clock read and its read of the records was gated, but under the older
    # version, so a signal's receipt fence said "active" where the gate had said "left".
    from community.cache import loader

    leave_community_layer(user_id=1)  # version 1
    read_gated = loader.read_gated

    def with_a_leave_in_between(using: str) -> object:
        leave_community_layer(user_id=2)  # version 2, after the warm read the clock
        return read_gated(using)

    monkeypatch.setattr(loader, "read_gated", with_a_leave_in_between)
    gate = LeaveCache().sync()
    assert gate.is_left(2) and gate.version == 2
