"""The leave record and its 9-byte codec, exactly as the design note packs it.

Pure Python, no Django import: workers, tests and tools can use it on its own.

Layout: ``[status: 1 byte][left_at_ns: u64 little-endian]``; ``None`` is written as 0,
so a stored 0 reads back as ``None``.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

RECORD_SIZE = 9
MAX_USER_ID = 2**63 - 1
_MAX_LEFT_AT_NS = 2**64 - 1
_PACK = struct.Struct("<BQ")


class MembershipStatus(IntEnum):
    ACTIVE = 0
    LEFT = 1


class CommunityMembership(NamedTuple):
    """One user's standing in the community layer (immutable)."""

    user_id: int
    status: MembershipStatus
    left_at_ns: int | None


def default_active(user_id: int) -> CommunityMembership:
    """The record of a user who never left: absent means active."""
    return CommunityMembership(user_id, MembershipStatus.ACTIVE, None)


def serialize_membership(m: CommunityMembership) -> bytes:
    """Pack ``m`` into exactly 9 bytes.

    Raises ``ValueError`` for a status that is not a ``MembershipStatus`` value or a
    ``left_at_ns`` outside 0..2**64-1: a record that cannot be packed is never written.
    """
    status = MembershipStatus(m.status)
    left_at_ns = 0 if m.left_at_ns is None else m.left_at_ns
    if not 0 <= left_at_ns <= _MAX_LEFT_AT_NS:
        raise ValueError(f"left_at_ns must be between 0 and 2**64-1, got {left_at_ns}")
    return _PACK.pack(status, left_at_ns)


def deserialize_membership(user_id: int, data: object) -> CommunityMembership | None:
    """Unpack a stored value; ``None`` for anything that is not a valid record.

    Valid means exactly 9 bytes whose first byte is 0 or 1. Never raises on bad input:
    the caller decides what a corrupt value means (the gate treats it as left).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    raw = bytes(data)
    if len(raw) != RECORD_SIZE:
        return None
    status, left_at_ns = _PACK.unpack(raw)
    if status not in (MembershipStatus.ACTIVE, MembershipStatus.LEFT):
        return None
    return CommunityMembership(user_id, MembershipStatus(status), left_at_ns or None)
