"""Leaving and rejoining the community layer (one user or many), and an erasure's leave.

Each change runs in one transaction that locks the leave clock first (so versions are
handed out and committed in order, and concurrent writers for the same user queue up),
writes the new record, and appends its history row keyed by the new version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Max

from tidalproject import metrics

from ..membership import (
    CommunityMembership,
    MembershipStatus,
    default_active,
    deserialize_membership,
    serialize_membership,
)
from ..models import (
    MAX_REASON_LENGTH,
    ChangeAction,
    ChangeSource,
    CommunityLeave,
    LeaveClock,
    LeaveHistory,
)
from ..webhooks.waking import kick_webhooks

logger = logging.getLogger(__name__)

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
    ChangeAction.ERASE: _to_left,  # an erasure leaves like a leave, with the same fence
}
# Actions written even when the record stays as it is: an erasure of a user already left
# still needs its own history row (its receipt), and the version it bumps is what every
# process's fence sees.
_ALWAYS_WRITTEN = frozenset({ChangeAction.ERASE})


class LayerChange(NamedTuple):
    """A user's record after a leave or rejoin, and the clock version of the change made
    (or, where nothing changed, of the last change to the record; 0 if it never changed)."""

    membership: CommunityMembership
    version: int


def _change_community_layer(
    *, user_ids: Iterable[int], action: ChangeAction, actor: Any, source: ChangeSource, reason: str = ""
) -> dict[int, LayerChange]:
    if len(reason) > MAX_REASON_LENGTH:
        raise ValueError(f"reason: at most {MAX_REASON_LENGTH} characters")
    ids = list(dict.fromkeys(user_ids))
    transition = _TRANSITIONS[action]
    always = action in _ALWAYS_WRITTEN
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
            if always or new != current:
                changed.append(new)
        changed_ids = {m.user_id for m in changed}
        versions = _last_versions([u for u in ids if u in stored and u not in changed_ids])
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
            transaction.on_commit(partial(_changed, action, source, changed, first_version))
            # Downstream delivery is woken after commit and never fails the change (community.webhooks).
            transaction.on_commit(kick_webhooks)
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
                        reason=reason,
                    )
                    for offset, m in enumerate(changed)
                ]
            )
            versions.update((m.user_id, first_version + offset) for offset, m in enumerate(changed))
    return {user_id: LayerChange(record, versions.get(user_id, 0)) for user_id, record in results.items()}


def _last_versions(user_ids: list[int]) -> dict[int, int]:
    """The version of each user's last change, for records a request left as they were."""
    if not user_ids:
        return {}
    return dict(
        LeaveHistory.objects.filter(user_id__in=user_ids)
        .values("user_id")
        .annotate(last=Max("version"))
        .values_list("user_id", "last")
    )


def _changed(action: ChangeAction, source: ChangeSource, changed: list[CommunityMembership], first: int) -> None:
    metrics.LEAVE_CHANGES.labels(action=action.value, source=source.value).inc(len(changed))
    for offset, record in enumerate(changed):
        logger.info(
            "community layer %s",
            action.value,
            extra={"user_id": record.user_id, "version": first + offset, "source": source.value},
        )


def leave_community_layer(
    *, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API, reason: str = ""
) -> LayerChange:
    """Make ``user_id`` leave: none of their signals processed from now on is forwarded.

    Idempotent: leaving while left changes nothing and keeps the first ``left_at_ns``.
    ``reason`` (at most 500 characters) is stored in the history row of the change; a
    no-op writes no row, so its reason is not kept.
    """
    return _change_community_layer(
        user_ids=[user_id], action=ChangeAction.LEAVE, actor=actor, source=source, reason=reason
    )[user_id]


def rejoin_community_layer(
    *, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API, reason: str = ""
) -> LayerChange:
    """Make ``user_id`` active again, keeping ``left_at_ns``. Rejoining while active changes nothing."""
    return _change_community_layer(
        user_ids=[user_id], action=ChangeAction.REJOIN, actor=actor, source=source, reason=reason
    )[user_id]


def bulk_leave_community_layer(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.API, reason: str = ""
) -> dict[int, LayerChange]:
    """Make every user in ``user_ids`` leave, all in one transaction (all or nothing)."""
    return _change_community_layer(
        user_ids=user_ids, action=ChangeAction.LEAVE, actor=actor, source=source, reason=reason
    )


def bulk_rejoin_community_layer(
    *, user_ids: Iterable[int], actor: Any = None, source: ChangeSource = ChangeSource.API, reason: str = ""
) -> dict[int, LayerChange]:
    """Make every user in ``user_ids`` active again, all in one transaction."""
    return _change_community_layer(
        user_ids=user_ids, action=ChangeAction.REJOIN, actor=actor, source=source, reason=reason
    )


def erase_community_layer(*, user_id: int, actor: Any = None, source: ChangeSource = ChangeSource.API) -> LayerChange:
    """The leave half of an erasure: ``user_id`` leaves (keeping an earlier ``left_at_ns``)
    and an ``erase`` history row is written at a new version, even when they were left.

    Meant to run inside the erasing transaction of ``signals_app.erasure``, which takes the
    user's signals back before it commits: the clock stays locked until then.
    """
    return _change_community_layer(user_ids=[user_id], action=ChangeAction.ERASE, actor=actor, source=source)[user_id]
