"""Reads of the community layer."""

from __future__ import annotations

from typing import NamedTuple

from django.db.models import QuerySet

from .membership import CommunityMembership, MembershipStatus, default_active, deserialize_membership
from .models import CommunityLeave, LeaveHistory


class LayerStatus(NamedTuple):
    """A user's record as the gate applies it; a corrupt record reads as left."""

    membership: CommunityMembership
    corrupt: bool


def community_layer_status(*, user_id: int) -> LayerStatus:
    """The stored record, or ``default_active`` where there is none.

    Read from the row itself (one primary-key query, the same cost as a fence check),
    so a status answer is always the committed truth.
    """
    value = CommunityLeave.objects.filter(pk=user_id).values_list("value", flat=True).first()
    if value is None:
        return LayerStatus(default_active(user_id), corrupt=False)
    record = deserialize_membership(user_id, value)
    if record is None:
        return LayerStatus(CommunityMembership(user_id, MembershipStatus.LEFT, None), corrupt=True)
    return LayerStatus(record, corrupt=False)


def community_layer_history(*, user_id: int) -> QuerySet[LeaveHistory]:
    """A user's changes, newest first."""
    return LeaveHistory.objects.filter(user_id=user_id).select_related("actor").order_by("-version")
