"""Data helpers the benchmarks share: psycopg only, no Django."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg

# Where left_at_ns starts: 2024-01-01T00:00:00Z, one record a second after it.
LEFT_AT_BASE_NS = 1_704_067_200 * 10**9
# Each aggregate table, its target column, and the signals' column of the targets credited.
AGGREGATES = (
    ("signals_app_communityaggregate", "community_id", "credited_communities"),
    ("signals_app_cohortaggregate", "cohort_id", "credited_cohorts"),
)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: str,
    types: list[str],
    rows: Iterable[Any],
    *,
    vacuum: bool = True,
) -> None:
    """Load rows with a binary COPY, then (with ``vacuum``) VACUUM ANALYZE so every reader finds a settled table."""
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
        if vacuum:
            cursor.execute(f"VACUUM ANALYZE {table}")


def copy_records(conn: psycopg.Connection[Any], table: str, rows: Iterable[tuple[int, bytes]]) -> None:
    """Leave records (user_id, value) by a binary COPY."""
    copy_rows(conn, table, "user_id, value", ["int8", "bytea"], rows)


def make_groups(conn: psycopg.Connection[Any], communities: int, cohorts: int, now: Any) -> None:
    """Communities c1..c``communities`` and cohorts k1..k``cohorts``, made by the database."""
    for table, count, prefix, name in (
        ("community_community", communities, "c", "community "),
        ("community_cohort", cohorts, "k", "cohort "),
    ):
        conn.execute(
            f"INSERT INTO {table} (slug, name, created_at) SELECT %s || g, %s || g, %s FROM generate_series(1, %s) g",
            [prefix, name, now, count],
        )


def add_up_aggregates(conn: psycopg.Connection[Any]) -> None:
    """Both aggregate tables as the attributed signals add up, by target, hour, item and kind."""
    for table, target, credited in AGGREGATES:
        conn.execute(
            f"INSERT INTO {table} ({target}, hour, item_id, kind, count, weight_sum, last_at) "
            "SELECT c.target::bigint, date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',"
            " s.item_id, s.kind, count(*), sum(s.weight), max(s.occurred_at) "
            f"FROM signals_app_signal s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) c(target) "
            "WHERE s.outcome = 1 GROUP BY 1, 2, 3, 4"
        )
