"""A group deleted while batches credit it: no aggregate row outlives its group.

The aggregate tables have no foreign key constraint to their group; a batch locks the groups
it credits FOR KEY SHARE, and a deletion locks the group FOR UPDATE before it collects what to
delete. Two connections, so PostgreSQL only (SQLite has one writer at a time: no race).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from community.models import Community
from signals_app.models import CohortAggregate, CommunityAggregate, Outcome, Signal
from signals_app.services.processing import signals_process
from signals_app.verification import verify_stop_forward
from tests.helpers import batch_held_open, in_thread, ingest, join, sig

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks across two connections: PostgreSQL"),
]

USER = 41


def delete(group: Community) -> None:
    Community.objects.filter(pk=group.pk).delete()


def test_a_deletion_waits_for_the_batch_crediting_the_group_and_takes_its_rows(
    sender, community, community2, cohort
) -> None:
    join(USER, community, community2, cohort)
    ids = ingest(sender, sig(USER), sig(USER, item_id=2))
    worker, release = batch_held_open(ids)  # the groups locked, the aggregates written
    deleter = in_thread(lambda: delete(community))
    deleter.join(1.0)
    assert deleter.is_alive(), "the deletion must wait for the batch that credits the group"
    release.set()
    worker.join(30)
    deleter.join(30)
    assert not Community.objects.filter(pk=community.pk).exists()
    assert set(CommunityAggregate.objects.values_list("community_id", flat=True)) == {community2.pk}
    assert CohortAggregate.objects.count() == 2
    assert set(Signal.objects.values_list("outcome", flat=True)) == {Outcome.ATTRIBUTED}


def test_a_batch_after_a_deletion_credits_nothing_to_the_deleted_group(sender, community, community2) -> None:
    join(USER, community, community2)
    only_there = USER + 1
    join(only_there, community)
    ids = ingest(sender, sig(USER), sig(only_there))
    locked, release = threading.Event(), threading.Event()

    def deletion() -> None:
        with transaction.atomic():
            delete(community)  # the group's row held FOR UPDATE until this commits
            locked.set()
            release.wait(30)

    deleter = in_thread(deletion)
    assert locked.wait(30)
    worker = in_thread(lambda: signals_process(signal_ids=ids))
    worker.join(1.0)
    assert worker.is_alive(), "the batch must wait for the deletion of a group it would credit"
    release.set()
    deleter.join(30)
    worker.join(30)
    assert list(CommunityAggregate.objects.values_list("community_id", "count")) == [(community2.pk, 1)]
    signals = {s.user_id: s for s in Signal.objects.all()}
    assert (signals[USER].outcome, signals[USER].credited_communities) == (Outcome.ATTRIBUTED, [community2.pk])
    assert (signals[only_there].outcome, signals[only_there].credited_communities) == (Outcome.NO_TARGET, None)
    result = verify_stop_forward(progress=False)
    assert result.passed, result.named


def test_the_admins_delete_of_one_group_locks_it_too(sender, community) -> None:
    join(USER, community)
    ids = ingest(sender, sig(USER))
    worker, release = batch_held_open(ids)
    deleter = in_thread(lambda: Community.objects.get(pk=community.pk).delete())  # Model.delete, as the admin's
    deleter.join(1.0)
    assert deleter.is_alive()
    release.set()
    worker.join(30)
    deleter.join(30)
    assert not CommunityAggregate.objects.exists()
