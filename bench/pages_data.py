"""The big tables of the pages benchmark, filled in SQL (generate_series), no Django.

Every value reaches the server as a bound parameter (psycopg's adaptation): the sizes, the
times, the 9-byte records (a ``bytea[]`` the rows pick from), the kinds. Secondary indexes
of the signals and the history are dropped before the load and built again afterwards from
their own definitions (``pg_indexes``), which is several times faster than maintaining them
row by row and leaves the same indexes the migrations made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from bench.tools import LEFT_AT_BASE_NS, make_groups
from community.membership import CommunityMembership, MembershipStatus, serialize_membership

KINDS = ["view", "like", "share", "comment", "save", "click", "follow", "report"]
SIGNAL_TABLE = "signals_app_signal"
RECORD_TABLE = "community_communityleave"
HISTORY_TABLE = "community_leavehistory"
COMMUNITY_AGGREGATES = "signals_app_communityaggregate"
COHORT_AGGREGATES = "signals_app_cohortaggregate"
BIG_TABLES = (SIGNAL_TABLE, RECORD_TABLE, HISTORY_TABLE, COMMUNITY_AGGREGATES, COHORT_AGGREGATES)
# Distinct record values the rows pick from (the pages decode them; their variety does not matter).
VALUES = 1_000


@dataclass(frozen=True)
class Sizes:
    signals: int
    records: int
    history: int
    communities: int
    cohorts: int
    # Aggregate rows per (community or cohort, hour): items x kinds that had a signal that hour.
    community_rows_per_hour: int
    cohort_rows_per_hour: int
    signal_days: int = 30
    history_days: int = 365
    aggregate_hours: int = 30 * 24
    heavy_users: int = 100  # ids 2..200 (even): 1% of all signals, a long list each

    @property
    def users(self) -> int:
        """Signals come from users 1..2 x records; every even id has a leave record."""
        return 2 * self.records


@dataclass
class Loaded:
    now: datetime
    sender_id: int
    seconds: dict[str, float]
    rows: dict[str, int]


def record_values(active: bool) -> list[bytes]:
    status = MembershipStatus.ACTIVE if active else MembershipStatus.LEFT
    return [
        serialize_membership(CommunityMembership(0, status, LEFT_AT_BASE_NS + index * 86_400 * 10**9))
        for index in range(VALUES)
    ]


def _secondary_indexes(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """Indexes of ``table`` that back no constraint (the primary key stays)."""
    rows = conn.execute(
        """
        SELECT i.relname, pg_get_indexdef(x.indexrelid)
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
        WHERE t.relname = %s AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
        """,
        [table],
    ).fetchall()
    return [(name, definition) for name, definition in rows]


def _without_indexes(conn: psycopg.Connection[Any], table: str, load: Callable[[], None]) -> None:
    indexes = _secondary_indexes(conn, table)
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    # Foreign keys are checked row by row: off during the load (the rows are made valid).
    conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
    try:
        load()
    finally:
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER ALL")
    for _, definition in indexes:
        conn.execute(definition)


def fill(
    conn: psycopg.Connection[Any], sizes: Sizes, *, sender_id: int, now: datetime, progress: Callable[[str], None]
) -> Loaded:
    """Load every table; ``conn`` is autocommit. Returns the seconds each step took."""
    seconds: dict[str, float] = {}
    conn.execute("SET synchronous_commit = off")
    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute("SELECT setseed(0.42)")

    def step(name: str, fn: Callable[[], None]) -> None:
        progress(f"data: {name}")
        started = time.perf_counter()
        fn()
        seconds[name] = time.perf_counter() - started

    def groups() -> None:
        make_groups(conn, sizes.communities, sizes.cohorts, now)

    left, active = record_values(active=False), record_values(active=True)

    def records() -> None:
        # Every even id up to 2 x records: 10% active (left, then rejoined), 0.01% corrupt.
        conn.execute(
            f"""
            INSERT INTO {RECORD_TABLE} (user_id, value)
            SELECT 2 * g,
                   CASE WHEN g %% 10000 = 7 THEN %(corrupt)s
                        WHEN g %% 10 = 3 THEN (%(active)s::bytea[])[1 + g %% %(values)s]
                        ELSE (%(left)s::bytea[])[1 + g %% %(values)s] END
            FROM generate_series(1, %(n)s) g
            """,
            {"n": sizes.records, "left": left, "active": active, "corrupt": b"\x07bad", "values": VALUES},
        )

    def history() -> None:
        # Versions 1..history, in time order over history_days; each record's user has
        # history / records changes (leave, rejoin, leave, ...), leaves and rejoins interleaved
        # in time. 90% api, 9% admin, 1% command.
        start = now - timedelta(days=sizes.history_days)
        step_us = sizes.history_days * 86_400 * 10**6 // sizes.history
        conn.execute(
            f"""
            INSERT INTO {HISTORY_TABLE} (version, user_id, action, value, actor_id, actor_label, source, at, reason)
            SELECT g, 2 * (1 + (g - 1) / %(per_user)s),
                   CASE WHEN ((g - 1) %% %(per_user)s) %% 2 = 0 THEN 'leave' ELSE 'rejoin' END,
                   CASE WHEN ((g - 1) %% %(per_user)s) %% 2 = 0 THEN (%(left)s::bytea[])[1 + g %% %(values)s]
                        ELSE (%(active)s::bytea[])[1 + g %% %(values)s] END,
                   NULL, 'bench',
                   CASE WHEN g %% 100 = 0 THEN 'command' WHEN g %% 11 = 0 THEN 'admin' ELSE 'api' END,
                   %(start)s + make_interval(secs => g::float8 * %(step)s / 1e6),
                   CASE WHEN g %% 4 = 0 THEN 'asked by email' ELSE '' END
            FROM generate_series(1, %(n)s) g
            """,
            {
                "n": sizes.history,
                "per_user": max(sizes.history // sizes.records, 1),
                "left": left,
                "active": active,
                "start": start,
                "step": step_us,
                "values": VALUES,
            },
        )
        conn.execute("UPDATE community_leaveclock SET version = %s WHERE id = 1", [sizes.history])

    def signals() -> None:
        # Ids in time order over signal_days up to a minute ago. Outcomes: the newest 0.05%
        # pending, then 0.01% failed, 10% gated (a reason each; corrupt_record rare), 15%
        # no target, the rest attributed to two communities and a cohort.
        start = now - timedelta(days=sizes.signal_days)
        step_us = (sizes.signal_days * 86_400 - 60) * 10**6 // sizes.signals
        pending_from = sizes.signals - max(sizes.signals // 2000, 1)
        conn.execute(
            f"""
            INSERT INTO {SIGNAL_TABLE} (
                id, sender_id, user_id, item_id, kind, weight, occurred_at, received_at, idempotency_key,
                outcome, processed_at, fence_at_receipt, fence_at_processing, gated_reason,
                credited_communities, credited_cohorts, enqueued_at, error)
            SELECT g, %(sender)s, user_id, item_id, kind, weight, t - interval '2 seconds', t, NULL,
                   o, CASE WHEN o = 0 THEN NULL ELSE t + interval '1 second' END,
                   fence, CASE WHEN o = 0 THEN NULL ELSE fence END,
                   CASE WHEN o = 2 THEN (CASE WHEN g %% 50000 = 0 THEN 4 ELSE 1 + g %% 3 END) END,
                   CASE WHEN o = 1 THEN jsonb_build_array(1 + g %% %(communities)s, 1 + (g / 7) %% %(communities)s) END,
                   CASE WHEN o = 1 THEN jsonb_build_array(1 + g %% %(cohorts)s) END,
                   t, CASE WHEN o = 4 THEN 'bench: a failure' ELSE '' END
            FROM (
                SELECT g,
                       %(start)s + make_interval(secs => g::float8 * %(step)s / 1e6) AS t,
                       CASE WHEN r1 < 0.01 THEN 2 * (1 + floor(r2 * %(heavy)s)::bigint)
                            ELSE 1 + floor(r2 * %(users)s)::bigint END AS user_id,
                       1 + floor(r3 * r3 * 50000)::bigint AS item_id,
                       (%(kinds)s::text[])[1 + floor(r4 * r4 * %(nkinds)s)::int] AS kind,
                       1 + floor(r1 * 5) AS weight,
                       CASE WHEN g > %(pending_from)s THEN 0 WHEN g %% 10000 = 1 THEN 4
                            WHEN r5 < 0.10 THEN 2 WHEN r5 < 0.25 THEN 3 ELSE 1 END AS o,
                       %(history)s::bigint * g / %(n)s AS fence
                FROM (
                    SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5
                    FROM generate_series(1, %(n)s) g
                ) drawn
            ) s
            """,
            {
                "n": sizes.signals,
                "sender": sender_id,
                "start": start,
                "step": step_us,
                "users": sizes.users,
                "heavy": sizes.heavy_users,
                "kinds": KINDS,
                "pending_from": pending_from,
                "history": sizes.history,
                "communities": sizes.communities,
                "cohorts": sizes.cohorts,
                "nkinds": len(KINDS),
            },
        )
        conn.execute(
            f"SELECT setval(pg_get_serial_sequence('{SIGNAL_TABLE}', 'id'), (SELECT max(id) FROM {SIGNAL_TABLE}))"
        )

    def aggregates() -> None:
        first_hour = (now - timedelta(hours=sizes.aggregate_hours - 1)).replace(minute=0, second=0, microsecond=0)
        for table, target, group_table, per_hour in (
            (COMMUNITY_AGGREGATES, "community_id", "community_community", sizes.community_rows_per_hour),
            (COHORT_AGGREGATES, "cohort_id", "community_cohort", sizes.cohort_rows_per_hour),
        ):
            # Distinct items a (target, hour): k x 7919 mod 50,000 is one-to-one for k < 50,000.
            conn.execute(
                f"""
                INSERT INTO {table} ({target}, hour, item_id, kind, count, weight_sum, last_at)
                SELECT grp.id, h.hour, 1 + (k * 7919 + grp.id * 31) %% 50000,
                       (%(kinds)s::text[])[1 + k %% %(nkinds)s], 1 + k %% 9, 1.5 * (1 + k %% 9),
                       h.hour + interval '30 minutes'
                FROM {group_table} grp
                CROSS JOIN (SELECT %(first)s + make_interval(hours => n) AS hour
                            FROM generate_series(0, %(hours)s - 1) n) h
                CROSS JOIN generate_series(1, %(per_hour)s) k
                ORDER BY h.hour, grp.id
                """,
                {
                    "kinds": KINDS,
                    "nkinds": len(KINDS),
                    "first": first_hour,
                    "hours": sizes.aggregate_hours,
                    "per_hour": per_hour,
                },
            )

    step("communities and cohorts", groups)
    step("leave records", lambda: _without_indexes(conn, RECORD_TABLE, records))
    step("history", lambda: _without_indexes(conn, HISTORY_TABLE, history))
    step("signals", lambda: _without_indexes(conn, SIGNAL_TABLE, signals))
    step("aggregates", aggregates)

    def vacuum() -> None:
        for table in (*BIG_TABLES, "community_community", "community_cohort", "community_leaveclock"):
            conn.execute(f"VACUUM ANALYZE {table}")

    step("VACUUM ANALYZE", vacuum)
    rows = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in BIG_TABLES}  # type: ignore[index]
    return Loaded(now=now, sender_id=sender_id, seconds=seconds, rows=rows)
