"""Demo data for a first run (``manage.py seed_demo``), made through the real services."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from .services.ingest import signals_ingest
from .validation import SignalIn


@dataclass(frozen=True)
class DemoReport:
    communities: int
    cohorts: int
    users: int
    left: int
    signals: int
    token: str


DEMO_COMMUNITIES = {"python": "Python", "rust": "Rust", "design": "Design", "music": "Music", "travel": "Travel"}
DEMO_COHORTS = {"early-adopters": "Early adopters", "power-users": "Power users", "new-this-month": "New this month"}
DEMO_KINDS = ("view", "like", "share", "comment")


def seed_demo(*, users: int, signals: int, seed: int) -> DemoReport | None:
    """Demo data through the real services; ``None`` when it is already there."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    from accounts.services import token_issue
    from community.models import Cohort, Community
    from community.services.groups import group_members_add
    from community.services.layer import bulk_leave_community_layer

    if Community.objects.filter(slug__in=DEMO_COMMUNITIES).exists():
        return None
    rng = random.Random(seed)  # noqa: S311 - demo data, not secrets
    service, _ = get_user_model().objects.get_or_create(username="demo-service")
    service.user_permissions.add(Permission.objects.get(content_type__app_label="signals_app", codename="add_signal"))
    _, token = token_issue(user=service)
    user_ids = list(range(1000, 1000 + users))
    communities = [Community.objects.create(slug=s, name=n) for s, n in DEMO_COMMUNITIES.items()]
    cohorts = [Cohort.objects.create(slug=s, name=n) for s, n in DEMO_COHORTS.items()]
    for groups, share in ((communities, 0.6), (cohorts, 0.5)):
        for group in groups:
            group_members_add(group=group, user_ids=[u for u in user_ids if rng.random() < share])
    left = rng.sample(user_ids, k=users // 10)
    bulk_leave_community_layer(user_ids=left, actor=service)
    now = timezone.now()
    batch = [
        SignalIn(
            user_id=rng.choice(user_ids),
            item_id=rng.randint(1, 60),
            kind=rng.choice(DEMO_KINDS),
            weight=float(rng.choice((1, 1, 1, 2, 5))),
            occurred_at=now - timedelta(minutes=rng.randint(0, 6 * 60)),
            idempotency_key=None,
        )
        for _ in range(signals)
    ]
    for start in range(0, len(batch), 1000):
        signals_ingest(sender=service, signals=batch[start : start + 1000])
    return DemoReport(
        communities=len(communities),
        cohorts=len(cohorts),
        users=users,
        left=len(left),
        signals=signals,
        token=token,
    )
