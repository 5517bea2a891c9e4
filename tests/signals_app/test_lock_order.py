"""A batch, an erasure and a group deletion at once, over and over: no deadlock, nothing lost.

The three lock rows that overlap (the user's signals, the group's row, its aggregate rows);
this runs them together on the same user and group, released by one barrier, each after a
pause that differs from round to round. A deadlock would fail one of them (PostgreSQL breaks
it after ``deadlock_timeout``); none may fail, and the stored data must prove the promise
afterwards. Three connections: PostgreSQL only.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from community.models import Cohort, Community
from signals_app.erasure import user_erase
from signals_app.models import CohortAggregate, CommunityAggregate, Signal
from signals_app.services.processing import signals_process
from signals_app.verification import verify_stop_forward
from tests.helpers import in_thread, ingest, join, sig

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks across connections: PostgreSQL"),
]

ROUNDS = 12


def together(seed: int, *works: Callable[[], Any]) -> list[Exception]:
    """Run ``works`` on threads of their own, released at once, each after a pause of up to 20 ms
    drawn from ``seed``; the errors they raised."""
    start = threading.Barrier(len(works))
    errors: list[Exception] = []
    rng = random.Random(seed)

    def released(work: Callable[[], Any], pause: float) -> Callable[[], None]:
        def run() -> None:
            start.wait(30)
            time.sleep(pause)
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - every failure is reported by the test
                errors.append(exc)

        return run

    threads = [in_thread(released(work, rng.uniform(0, 0.02))) for work in works]
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a transaction is still waiting after 60 s"
    return errors


def test_a_batch_an_erasure_and_a_group_deletion_together_never_deadlock(sender) -> None:
    for round_ in range(ROUNDS):
        community = Community.objects.create(slug=f"c{round_}", name="c")
        kept = Community.objects.create(slug=f"k{round_}", name="k")
        cohort = Cohort.objects.create(slug=f"h{round_}", name="h")
        erased, other = 1_000 + 2 * round_, 1_001 + 2 * round_
        for user in (erased, other):
            join(user, community, kept, cohort)
        # Contributions to take back, then a batch in flight for both users.
        signals_process(signal_ids=ingest(sender, sig(erased), sig(other)))
        batch = ingest(sender, *(sig(user, item_id=item) for user in (erased, other) for item in range(2, 12)))

        errors = together(
            round_,
            lambda: signals_process(signal_ids=batch),
            lambda erased=erased: user_erase(user_id=erased),
            lambda community=community: Community.objects.filter(pk=community.pk).delete(),
        )

        assert not errors, f"round {round_}: {errors!r}"
        assert not Community.objects.filter(pk=community.pk).exists()
        assert not Signal.objects.filter(user_id=erased).exists()
        assert not CommunityAggregate.objects.filter(community_id=community.pk).exists()
        # The other user's signals all reached the groups that remain, once each.
        processed = Signal.objects.filter(user_id=other, processed_at__isnull=False).count()
        assert processed == 11
        totals = CohortAggregate.objects.filter(cohort_id=cohort.pk).values_list("count", flat=True)
        assert sum(totals) == 11
    result = verify_stop_forward(progress=False)
    assert result.passed, result.named
