"""Rebuilding the leave status: validate every record, then make every process re-warm."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from django.db import transaction
from tqdm import tqdm

from ..membership import MembershipStatus, deserialize_membership
from ..models import CommunityLeave, LeaveClock


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
