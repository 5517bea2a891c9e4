"""Leave, rejoin and status through the services: the semantics of DESIGN.md section 4."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from community.membership import CommunityMembership, MembershipStatus, serialize_membership
from community.models import ChangeAction, ChangeSource, CommunityLeave, LeaveClock, LeaveHistory
from community.selectors import community_layer_history, community_layer_status
from community.services.layer import (
    bulk_leave_community_layer,
    bulk_rejoin_community_layer,
    leave_community_layer,
    rejoin_community_layer,
)
from community.services.rebuild import leave_cache_rewarm_everywhere

pytestmark = pytest.mark.django_db


def clock_version() -> int:
    return LeaveClock.objects.get(pk=1).version


def stored(user_id: int) -> bytes:
    return bytes(CommunityLeave.objects.get(pk=user_id).value)


def test_absent_means_active() -> None:
    status = community_layer_status(user_id=5)
    assert status.membership == CommunityMembership(5, MembershipStatus.ACTIVE, None)
    assert not status.corrupt
    assert not CommunityLeave.objects.exists()


def test_leave_writes_the_packed_record_and_one_history_row(member) -> None:
    record = leave_community_layer(user_id=5, actor=member, source=ChangeSource.API).membership
    assert record.status == MembershipStatus.LEFT and record.left_at_ns
    assert stored(5) == serialize_membership(record)
    (entry,) = LeaveHistory.objects.all()
    assert (entry.user_id, entry.action, entry.source) == (5, ChangeAction.LEAVE, ChangeSource.API)
    assert (entry.actor, entry.actor_label) == (member, member.username)
    assert bytes(entry.value) == stored(5)
    assert entry.version == clock_version() == 1
    assert community_layer_status(user_id=5).membership == record


def test_leave_again_changes_nothing_and_keeps_the_first_time() -> None:
    first = leave_community_layer(user_id=5).membership
    again = leave_community_layer(user_id=5).membership
    assert again == first
    assert LeaveHistory.objects.count() == 1
    assert clock_version() == 1


def test_rejoin_keeps_left_at_and_rejoin_while_active_is_a_no_op() -> None:
    assert rejoin_community_layer(user_id=5).membership == CommunityMembership(5, MembershipStatus.ACTIVE, None)
    assert not CommunityLeave.objects.exists() and not LeaveHistory.objects.exists()
    left = leave_community_layer(user_id=5).membership
    back = rejoin_community_layer(user_id=5).membership
    assert back == CommunityMembership(5, MembershipStatus.ACTIVE, left.left_at_ns)
    assert rejoin_community_layer(user_id=5).membership == back
    assert list(community_layer_history(user_id=5).values_list("action", flat=True)) == ["rejoin", "leave"]
    assert clock_version() == 2


def test_leave_after_rejoin_takes_a_new_time() -> None:
    first = leave_community_layer(user_id=5).membership
    rejoin_community_layer(user_id=5)
    second = leave_community_layer(user_id=5).membership
    assert second.status == MembershipStatus.LEFT
    assert second.left_at_ns is not None and first.left_at_ns is not None
    assert second.left_at_ns >= first.left_at_ns
    assert [e.version for e in community_layer_history(user_id=5)] == [3, 2, 1]


def test_bulk_leave_is_one_change_per_changed_user_with_consecutive_versions() -> None:
    leave_community_layer(user_id=2)
    results = bulk_leave_community_layer(user_ids=[1, 2, 3, 1], source=ChangeSource.COMMAND)
    assert list(results) == [1, 2, 3]
    assert all(r.membership.status == MembershipStatus.LEFT for r in results.values())
    assert sorted(LeaveHistory.objects.values_list("version", "user_id")) == [(1, 2), (2, 1), (3, 3)]
    assert clock_version() == 3
    assert {u: r.version for u, r in results.items()} == {1: 2, 2: 1, 3: 3}
    bulk_rejoin_community_layer(user_ids=[1, 3])
    assert clock_version() == 5


def test_a_change_answers_its_version_and_a_kept_record_the_version_of_its_last_change() -> None:
    assert leave_community_layer(user_id=5).version == 1
    assert leave_community_layer(user_id=6).version == 2
    assert leave_community_layer(user_id=5).version == 1  # already left: the record kept
    assert rejoin_community_layer(user_id=7).version == 0  # never changed
    assert rejoin_community_layer(user_id=5).version == 3


def test_corrupt_record_reads_as_left_and_is_repaired_by_a_change() -> None:
    CommunityLeave.objects.create(user_id=9, value=b"\x07" * 9)
    status = community_layer_status(user_id=9)
    assert status.corrupt and status.membership.status == MembershipStatus.LEFT
    record = leave_community_layer(user_id=9).membership
    assert record.status == MembershipStatus.LEFT and record.left_at_ns
    assert stored(9) == serialize_membership(record)

    CommunityLeave.objects.filter(pk=9).update(value=b"\x01")
    assert rejoin_community_layer(user_id=9).membership == CommunityMembership(9, MembershipStatus.ACTIVE, None)
    assert not community_layer_status(user_id=9).corrupt


def test_a_failed_transaction_writes_nothing() -> None:
    """All or nothing: an id the database refuses rolls back the whole change."""
    leave_community_layer(user_id=1)
    with pytest.raises(IntegrityError):
        bulk_leave_community_layer(user_ids=[2, -5])  # -5 breaks the user_id range constraint
    assert list(CommunityLeave.objects.values_list("user_id", flat=True)) == [1]
    assert LeaveHistory.objects.count() == 1
    assert clock_version() == 1


def test_history_survives_the_actor_account_being_deleted(member) -> None:
    leave_community_layer(user_id=5, actor=member)
    username = member.username
    member.delete()
    entry = LeaveHistory.objects.get()
    assert entry.actor is None and entry.actor_label == username


def test_rewarm_everywhere_bumps_the_generation_only() -> None:
    leave_community_layer(user_id=1)
    assert leave_cache_rewarm_everywhere() == 1
    clock = LeaveClock.objects.get(pk=1)
    assert (clock.version, clock.generation) == (1, 1)
