"""The CSV export of a million records in constant memory."""

from __future__ import annotations

import tracemalloc

import pytest
from django.db import connection
from rest_framework.test import APIClient

from community.membership import CommunityMembership, MembershipStatus, serialize_membership
from community.models import CommunityLeave

ROWS = 1_000_000


def _insert_left(count: int) -> None:
    table = CommunityLeave._meta.db_table
    value = serialize_membership(CommunityMembership(0, MembershipStatus.LEFT, 1_700_000_000_123_456_789))
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} (user_id, value) FROM STDIN") as copy:
                for uid in range(count):
                    copy.write_row((uid, value))
        else:
            cursor.executemany(
                f"INSERT INTO {table} (user_id, value) VALUES (%s, %s)", ((uid, value) for uid in range(count))
            )


@pytest.mark.slow
@pytest.mark.django_db
def test_a_million_row_export_streams_in_constant_memory(operator: object) -> None:
    _insert_left(ROWS)
    api = APIClient()
    api.force_authenticate(operator)
    response = api.get("/api/community-layer/export/", {"status": "left"})
    assert response.status_code == 200 and response.streaming
    lines = 0
    size = 0
    tracemalloc.start()
    try:
        for chunk in response.streaming_content:
            lines += chunk.count(b"\n")
            size += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == ROWS + 1  # and the header
    # The whole CSV is ~70 MB and the rows as Python objects several times that; what is held
    # at once is a chunk of rows and a thousand lines.
    assert size > 50_000_000
    assert peak < 16 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
