"""The promises end to end: real HTTP (pytest-django's live server), a real Celery worker
process, the configured broker (Redis in CI) and database (PostgreSQL in CI)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from django.conf import settings

from community.models import Cohort, Community
from community.services.groups import group_members_add
from signals_app.models import CohortAggregate, CommunityAggregate, Outcome, Signal
from tests.factories import UserFactory, api_token
from tests.helpers import manage
from tests.processes import Worker, http, wait_for
from tidalproject.celery import app as celery_app

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


@pytest.fixture
def token() -> str:
    service = UserFactory(
        perms=[
            "signals_app.add_signal",
            "signals_app.view_signal",
            "community.change_communityleave",
            "community.view_communityleave",
        ]
    )
    return api_token(service)


@pytest.fixture
def targets() -> dict[str, Any]:
    """User 501 is in communities c1 and c2 and cohort k1; user 502 in c1 only."""
    c1, c2 = Community.objects.create(slug="c1", name="C1"), Community.objects.create(slug="c2", name="C2")
    k1 = Cohort.objects.create(slug="k1", name="K1")
    group_members_add(group=c1, user_ids=[501, 502])
    group_members_add(group=c2, user_ids=[501])
    group_members_add(group=k1, user_ids=[501])
    return {"c1": c1, "c2": c2, "k1": k1}


@pytest.fixture
def worker() -> Iterator[Any]:
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker())
        return started[-1]

    celery_app.control.purge()  # messages left by earlier tests point at rows that are gone
    yield start
    for each in started:
        each.stop()


def lose_every_queued_message() -> None:
    """The broker loses what it holds: Redis is flushed; another broker's queue is purged."""
    url = settings.CELERY_BROKER_URL
    if url.startswith("redis://"):
        redis.Redis.from_url(url).flushdb()
    else:
        celery_app.control.purge()


def aggregates() -> dict[tuple[Any, ...], tuple[int, float]]:
    rows = {
        ("community", a.community_id, a.item_id, a.kind, a.hour): (a.count, a.weight_sum)
        for a in CommunityAggregate.objects.all()
    }
    rows.update(
        {
            ("cohort", a.cohort_id, a.item_id, a.kind, a.hour): (a.count, a.weight_sum)
            for a in CohortAggregate.objects.all()
        }
    )
    return rows


def no_pending() -> bool:
    return not Signal.objects.filter(outcome=Outcome.PENDING).exists()


def post_signals(url: str, token: str, signals: list[dict[str, Any]]) -> dict[str, Any]:
    status, body = http("POST", f"{url}/api/signals/", token=token, body={"signals": signals})
    assert status == 202, body
    return body


def test_leave_stops_forwarding_and_rejoin_restores_it(live_server, token, targets, worker) -> None:
    url = live_server.url
    worker()
    signal = {"user_id": 501, "item_id": 9, "kind": "like", "weight": 2}

    assert post_signals(url, token, [signal] * 3) == {"accepted": 3, "duplicates": 0, "suppressed": 0}
    wait_for(no_pending, what="the first signals to be processed")
    before = aggregates()
    assert sorted(v for v in before.values()) == [(3, 6.0)] * 3  # c1, c2 and k1 each got all three

    status, body = http("POST", f"{url}/api/community-layer/501/leave/", token=token)
    assert status == 200 and body["status"] == "left"
    post_signals(url, token, [signal] * 4)
    wait_for(no_pending, what="the signals sent after the leave")
    assert aggregates() == before
    assert Signal.objects.filter(outcome=Outcome.GATED).count() == 4

    status, body = http("POST", f"{url}/api/community-layer/501/rejoin/", token=token)
    assert status == 200 and body["status"] == "active"
    post_signals(url, token, [signal] * 5)
    wait_for(no_pending, what="the signals sent after the rejoin")
    assert sorted(aggregates().values()) == [(8, 16.0)] * 3
    assert Counter(Signal.objects.values_list("outcome", flat=True)) == {Outcome.ATTRIBUTED: 8, Outcome.GATED: 4}

    status, body = http("GET", f"{url}/api/community-layer/501/signals/?limit=20", token=token)
    assert status == 200 and Counter(s["outcome"] for s in body["results"]) == {"attributed": 8, "gated": 4}


def test_messages_lost_by_the_broker_are_swept_up_and_counted_once(live_server, token, targets, worker) -> None:
    url = live_server.url
    rng = random.Random(3)
    now = datetime.now(UTC).replace(microsecond=0)
    sent = [
        {
            "user_id": rng.choice([501, 502, 503]),
            "item_id": rng.randint(1, 5),
            "kind": rng.choice(["like", "view"]),
            "weight": rng.choice([1, 0.5, 3]),
            "occurred_at": (now - timedelta(minutes=rng.randint(0, 180))).isoformat(),
        }
        for _ in range(1200)
    ]
    for start in range(0, len(sent), 400):
        post_signals(url, token, sent[start : start + 400])
    assert Signal.objects.count() == 1200

    lose_every_queued_message()

    def sweep() -> str:
        done = manage("requeue_pending_signals", "--older-than", "0")
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "enqueued 1200 pending signal(s)" in sweep()
    worker()
    wait_for(no_pending, what="the swept signals to be processed")
    assert "enqueued 0 pending signal(s)" in sweep()

    # The expectation, computed from what was sent and the memberships, not by the pipeline.
    members = {501: ["c1", "c2", "k1"], 502: ["c1"], 503: []}
    ids = {name: group.pk for name, group in targets.items()}
    expected: dict[tuple[Any, ...], list[float]] = {}
    for s in sent:
        hour = datetime.fromisoformat(s["occurred_at"]).replace(minute=0, second=0)
        for name in members[s["user_id"]]:
            key = ("cohort" if name == "k1" else "community", ids[name], s["item_id"], s["kind"], hour)
            total = expected.setdefault(key, [0, 0.0])
            total[0] += 1
            total[1] += s["weight"]
    assert aggregates() == {k: (v[0], pytest.approx(v[1])) for k, v in expected.items()}
    no_target = sum(1 for s in sent if s["user_id"] == 503)
    assert Signal.objects.filter(outcome=Outcome.NO_TARGET).count() == no_target
