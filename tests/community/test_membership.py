"""The 9-byte record codec: exact bytes, round trips, and no input that makes it raise."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from community.membership import (
    RECORD_SIZE,
    CommunityMembership,
    MembershipStatus,
    default_active,
    deserialize_membership,
    serialize_membership,
)
from tests.helpers import PROJECT_DIR

user_ids = st.integers(min_value=0, max_value=2**63 - 1)
left_ats = st.none() | st.integers(min_value=1, max_value=2**64 - 1)
records = st.builds(CommunityMembership, user_ids, st.sampled_from(MembershipStatus), left_ats)


def test_design_example_bytes() -> None:
    record = CommunityMembership(1, MembershipStatus.LEFT, 1732924800123456789)
    assert serialize_membership(record) == bytes.fromhex("01 15 cd d2 9d ec 95 0c 18")
    assert deserialize_membership(1, bytes.fromhex("0115cdd29dec950c18")) == record


def test_status_values_and_default() -> None:
    assert MembershipStatus.ACTIVE == 0 and MembershipStatus.LEFT == 1
    assert default_active(42) == CommunityMembership(42, MembershipStatus.ACTIVE, None)
    assert serialize_membership(default_active(42)) == bytes(9)


def test_none_is_written_as_zero_and_zero_reads_as_none() -> None:
    data = serialize_membership(CommunityMembership(3, MembershipStatus.LEFT, None))
    assert data == b"\x01" + bytes(8)
    assert deserialize_membership(3, data) == CommunityMembership(3, MembershipStatus.LEFT, None)


@given(records)
def test_round_trip(record: CommunityMembership) -> None:
    data = serialize_membership(record)
    assert len(data) == RECORD_SIZE
    assert deserialize_membership(record.user_id, data) == record


@given(user_ids, st.binary(max_size=32))
def test_any_bytes_decode_without_raising(user_id: int, data: bytes) -> None:
    result = deserialize_membership(user_id, data)
    valid = len(data) == RECORD_SIZE and data[0] in (0, 1)
    assert (result is not None) == valid
    if result is not None:
        assert serialize_membership(result) == data


@given(st.one_of(st.none(), st.integers(), st.text(), st.floats(), st.lists(st.integers())))
def test_non_bytes_decode_to_none(data: object) -> None:
    assert deserialize_membership(1, data) is None


@given(st.binary(min_size=9, max_size=9))
def test_memoryview_and_bytearray_decode_like_bytes(data: bytes) -> None:
    expected = deserialize_membership(7, data)
    assert deserialize_membership(7, memoryview(data)) == expected
    assert deserialize_membership(7, bytearray(data)) == expected


@pytest.mark.parametrize("left_at_ns", [-1, 2**64])
def test_serialize_refuses_what_cannot_be_packed(left_at_ns: int) -> None:
    with pytest.raises(ValueError, match="left_at_ns"):
        serialize_membership(CommunityMembership(1, MembershipStatus.LEFT, left_at_ns))


def test_serialize_refuses_unknown_status() -> None:
    with pytest.raises(ValueError):
        serialize_membership(CommunityMembership(1, 2, None))  # type: ignore[arg-type]


def test_codec_imports_without_django() -> None:
    code = "import sys, community.membership; sys.exit('django' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=PROJECT_DIR, check=False).returncode == 0
