"""Writes to the community layer: leave, rejoin, and the re-warm of every process.

Each change runs in one transaction that locks the leave clock first (so versions are
handed out and committed in order, and concurrent writers for the same user queue up),
writes the new record, and appends its history row keyed by the new version.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from tqdm import tqdm

from .membership import (
    CommunityMembership,
    MembershipStatus,
    default_active,
    deserialize_membership,
    serialize_membership,
)
from .models import ChangeAction, ChangeSource, CommunityLeave, LeaveClock, LeaveHistory

# What a change does to the current record (None where the stored value is corrupt);
# returning the current record unchanged means "nothing to write".
_Transition = Callable[[int, CommunityMembership | None, int], CommunityMembership]


def _to_left(user_id: int, current: CommunityMembership | None, now_ns: int) -> CommunityMembership:
    if current is not None and current.status == MembershipStatus.LEFT:
        return current  # already left: keep the first left_at_ns, so retries are safe
    return CommunityMembership(user_id, MembershipStatus.LEFT, now_ns)


def _to_active(user_id: int, current: CommunityMembership | None, now_ns: int) -> CommunityMembership:
    if current is None:
        # A corrupt record cannot tell when the user left; rejoining writes a clean record.
        return default_active(user_id)
    if current.status == MembershipStatus.ACTIVE:
        return current
    return CommunityMembership(user_id, MembershipStatus.ACTIVE, current.left_at_ns)


_TRANSITIONS: dict[ChangeAction, _Transition] = {
    ChangeAction.LEAVE: _to_left,
    ChangeAction.REJOIN: _to_active,
}


def _change_community_layer(
    *, user_ids: Iterable[int], action: ChangeAction, actor: Any, source: ChangeSource
) -> dict[int, CommunityMembership]:
    ids = list(dict.fromkeys(user_ids))
    transition = _TRANSITIONS[action]
    actor_id = actor.pk if actor is not None and actor.is_authenticated else None
    actor_label = actor.get_username() if actor_id is not None else ""
    with transaction.atomic():
        clock = LeaveClock.objects.select_for_update().get(pk=1)
        stored = dict(CommunityLeave.objects.filter(pk__in=ids).values_list("user_id", "value"))
        now_ns = time.time_ns()
        results: dict[int, CommunityMembership] = {}
        changed: list[CommunityMembership] = []
        for user_id in ids:
            current = deserialize_membership(user_id, stored[user_id]) if user_id in stored else default_active(user_id)
            new = transition(user_id, current, now_ns)
            results[user_id] = new
            if new != current:
                changed.append(new)
        if changed:
            first_version = clock.version + 1
            clock.version += len(changed)
            clock.save(update_fields=["version"])
            CommunityLeave.objects.bulk_create(
                [CommunityLeave(user_id=m.user_id, value=serialize_membership(m)) for m in changed],
                update_conflicts=True,
                unique_fields=["user_id"],
                update_fields=["value"],
            )
            LeaveHistory.objects.bulk_create(
                [
                    LeaveHistory(
                        version=first_version + offset,
                        user_id=m.user_id,
                        action=action,
                        value=serialize_membership(m),
                        actor_id=actor_id,
                        actor_label=actor_label,
                        source=source,
                    )
                    for offset, m in enumerate(changed)
                ]
            )
    return results


def leave_community_layer(
    *, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API
) -> CommunityMembership:
    """Make ``user_id`` leave: none of their signals processed from now on is forwarded.

    Idempotent: leaving while left changes nothing and keeps the first ``left_at_ns``.
    """
    return _change_community_layer(user_ids=[user_id], action=ChangeAction.LEAVE, actor=actor, source=source)[user_id]


def rejoin_community_layer(
    *, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API
) -> CommunityMembership:
    """Make ``user_id`` active again, keeping ``left_at_ns``. Rejoining while active changes nothing."""
    return _change_community_layer(user_ids=[user_id], action=ChangeAction.REJOIN, actor=actor, source=source)[user_id]


def bulk_leave_community_layer(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.API
) -> dict[int, CommunityMembership]:
    """Make every user in ``user_ids`` leave, all in one transaction (all or nothing)."""
    return _change_community_layer(user_ids=user_ids, action=ChangeAction.LEAVE, actor=actor, source=source)


def bulk_rejoin_community_layer(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.API
) -> dict[int, CommunityMembership]:
    """Make every user in ``user_ids`` active again, all in one transaction."""
    return _change_community_layer(user_ids=user_ids, action=ChangeAction.REJOIN, actor=actor, source=source)


def leave_cache_rewarm_everywhere() -> int:
    """Bump the clock's generation: every process re-warms at its next sync. Returns it."""
    with transaction.atomic():
        clock = LeaveClock.objects.select_for_update().get(pk=1)
        clock.generation += 1
        clock.save(update_fields=["generation"])
    return clock.generation


@dataclass(frozen=True)
class RebuildReport:
    total: int
    active: int
    left: int
    corrupt: list[tuple[int, bytes]]
    generation: int


def rebuild_leave_status(*, progress: bool = True) -> RebuildReport:
    """Validate every stored record, then make every process re-warm its cache.

    The progress bar goes to stderr and only on a terminal (``progress`` False hides it).
    Corrupt records are reported, not changed: the gate keeps treating them as left.
    """
    total = CommunityLeave.objects.count()
    rows = CommunityLeave.objects.order_by("user_id").values_list("user_id", "value").iterator(chunk_size=10_000)
    counts = {MembershipStatus.ACTIVE: 0, MembershipStatus.LEFT: 0}
    corrupt: list[tuple[int, bytes]] = []
    bar = tqdm(
        rows, total=total, unit="records", desc="leave records", file=sys.stderr, disable=None if progress else True
    )
    for user_id, value in bar:
        record = deserialize_membership(user_id, value)
        if record is None:
            corrupt.append((user_id, bytes(value)))
        else:
            counts[record.status] += 1
    generation = leave_cache_rewarm_everywhere()
    return RebuildReport(
        total=sum(counts.values()) + len(corrupt),
        active=counts[MembershipStatus.ACTIVE],
        left=counts[MembershipStatus.LEFT],
        corrupt=corrupt,
        generation=generation,
    )
