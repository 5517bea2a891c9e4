"""The big tables of the pages benchmark, filled in SQL (generate_series), every value a bound
parameter. A table's secondary indexes are dropped before its load and made again afterwards from
their own definitions: several times faster than keeping them up row by row, and the same indexes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench.common import progress
from bench.tools import AGGREGATES, LEFT_AT_BASE_NS, make_groups
from community.membership import CommunityMembership, MembershipStatus, serialize_membership

KINDS = ["view", "like", "share", "comment", "save", "click", "follow", "report"]
SIGNAL_TABLE = "signals_app_signal"
RECORD_TABLE = "community_communityleave"
HISTORY_TABLE = "community_leavehistory"
BIG_TABLES = (SIGNAL_TABLE, RECORD_TABLE, HISTORY_TABLE, *(table for table, _, _ in AGGREGATES))
COMMUNITIES, COHORTS = 200, 50
SIGNAL_DAYS, HISTORY_DAYS, AGGREGATE_HOURS = 30, 365, 30 * 24
HEAVY_USERS = 100  # ids 2..200 (even): 1% of all signals, a long list each
# Distinct record values the rows pick from (the pages decode them; their variety does not matter).
VALUES = 1_000

# Every even id up to 2 x records: 10% active (left, then rejoined), 0.01% corrupt.
RECORDS = f"""
INSERT INTO {RECORD_TABLE} (user_id, value)
SELECT 2 * g,
       CASE WHEN g %% 10000 = 7 THEN %(corrupt)s
            WHEN g %% 10 = 3 THEN (%(active)s::bytea[])[1 + g %% %(values)s]
            ELSE (%(left)s::bytea[])[1 + g %% %(values)s] END
FROM generate_series(1, %(records)s) g
"""

# Versions 1..history, in time order over HISTORY_DAYS; each record's user has history / records
# changes (leave, rejoin, leave, ...), leaves and rejoins interleaved in time. 90% api, 9% admin, 1% command.
HISTORY = f"""
INSERT INTO {HISTORY_TABLE} (version, user_id, action, value, actor_id, actor_label, source, at, reason)
SELECT g, 2 * (1 + (g - 1) / %(per_user)s),
       CASE WHEN ((g - 1) %% %(per_user)s) %% 2 = 0 THEN 'leave' ELSE 'rejoin' END,
       CASE WHEN ((g - 1) %% %(per_user)s) %% 2 = 0 THEN (%(left)s::bytea[])[1 + g %% %(values)s]
            ELSE (%(active)s::bytea[])[1 + g %% %(values)s] END,
       NULL, 'bench',
       CASE WHEN g %% 100 = 0 THEN 'command' WHEN g %% 11 = 0 THEN 'admin' ELSE 'api' END,
       %(history_start)s + make_interval(secs => g::float8 * %(history_step)s / 1e6),
       CASE WHEN g %% 4 = 0 THEN 'asked by email' ELSE '' END
FROM generate_series(1, %(history)s) g
"""

# Ids in time order over SIGNAL_DAYS up to a minute ago. Outcomes: the newest 0.05% pending, then
# 0.01% failed, 10% gated (a reason each; corrupt_record rare), 15% no target, the rest
# attributed to two communities and a cohort.
SIGNALS = f"""
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
           %(signal_start)s + make_interval(secs => g::float8 * %(signal_step)s / 1e6) AS t,
           CASE WHEN r1 < 0.01 THEN 2 * (1 + floor(r2 * %(heavy)s)::bigint)
                ELSE 1 + floor(r2 * %(users)s)::bigint END AS user_id,
           1 + floor(r3 * r3 * 50000)::bigint AS item_id,
           (%(kinds)s::text[])[1 + floor(r4 * r4 * %(nkinds)s)::int] AS kind,
           1 + floor(r1 * 5) AS weight,
           CASE WHEN g > %(pending_from)s THEN 0 WHEN g %% 10000 = 1 THEN 4
                WHEN r5 < 0.10 THEN 2 WHEN r5 < 0.25 THEN 3 ELSE 1 END AS o,
           %(history)s::bigint * g / %(signals)s AS fence
    FROM (
        SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4, random() AS r5
        FROM generate_series(1, %(signals)s) g
    ) drawn
) s
"""

# {target}_rows distinct items a (target, hour): k x 7919 mod 50,000 is one-to-one for k < 50,000.
AGGREGATE_ROWS = """
INSERT INTO {table} ({target}, hour, item_id, kind, count, weight_sum, last_at)
SELECT grp.id, h.hour, 1 + (k * 7919 + grp.id * 31) %% 50000,
       (%(kinds)s::text[])[1 + k %% %(nkinds)s], 1 + k %% 9, 1.5 * (1 + k %% 9),
       h.hour + interval '30 minutes'
FROM {groups} grp
CROSS JOIN (SELECT %(first_hour)s + make_interval(hours => n) AS hour
            FROM generate_series(0, %(aggregate_hours)s - 1) n) h
CROSS JOIN generate_series(1, %({target}_rows)s) k
ORDER BY h.hour, grp.id
"""

# Indexes that back no constraint (the primary key stays).
SECONDARY_INDEXES = """
SELECT i.relname, pg_get_indexdef(x.indexrelid)
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname = %s AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid)
"""


def record_values(status: MembershipStatus) -> list[bytes]:
    return [
        serialize_membership(CommunityMembership(0, status, LEFT_AT_BASE_NS + index * 86_400 * 10**9))
        for index in range(VALUES)
    ]


def fill(conn: psycopg.Connection[Any], args: Any, sender_id: int, now: datetime) -> None:
    """Every table of the sizes ``args`` gives; ``conn`` is autocommit."""
    signals, records, history = args.signals, args.records, args.history
    conn.execute("SET synchronous_commit = off")
    conn.execute("SET maintenance_work_mem = '512MB'")
    conn.execute("SELECT setseed(0.42)")
    params = {
        "records": records,
        "history": history,
        "signals": signals,
        "per_user": max(history // records, 1),
        "left": record_values(MembershipStatus.LEFT),
        "active": record_values(MembershipStatus.ACTIVE),
        "corrupt": b"\x07bad",
        "values": VALUES,
        "history_start": now - timedelta(days=HISTORY_DAYS),
        "history_step": HISTORY_DAYS * 86_400 * 10**6 // history,
        "signal_start": now - timedelta(days=SIGNAL_DAYS),
        "signal_step": (SIGNAL_DAYS * 86_400 - 60) * 10**6 // signals,
        "sender": sender_id,
        "users": 2 * records,
        "heavy": HEAVY_USERS,
        "kinds": KINDS,
        "nkinds": len(KINDS),
        "pending_from": signals - max(signals // 2000, 1),
        "communities": COMMUNITIES,
        "cohorts": COHORTS,
        "first_hour": (now - timedelta(hours=AGGREGATE_HOURS - 1)).replace(minute=0, second=0, microsecond=0),
        "aggregate_hours": AGGREGATE_HOURS,
        "community_id_rows": 2 if args.quick else 35,
        "cohort_id_rows": 3 if args.quick else 40,
    }
    make_groups(conn, COMMUNITIES, COHORTS, now)
    aggregates = [
        (table, [AGGREGATE_ROWS.format(table=table, target=target, groups=groups)])
        for (table, target, _), groups in zip(AGGREGATES, ("community_community", "community_cohort"), strict=True)
    ]
    for table, statements in (
        (RECORD_TABLE, [RECORDS]),
        (HISTORY_TABLE, [HISTORY, "UPDATE community_leaveclock SET version = %(history)s WHERE id = 1"]),
        (SIGNAL_TABLE, [SIGNALS, f"SELECT setval(pg_get_serial_sequence('{SIGNAL_TABLE}', 'id'), %(signals)s)"]),
        *aggregates,
    ):
        progress(f"data: {table}")
        indexes = conn.execute(SECONDARY_INDEXES, [table]).fetchall()
        for index, _ in indexes:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))  # a name from the catalog
        # Foreign keys are checked row by row: off during the load (the rows are made valid).
        conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER ALL")
        for statement in statements:
            conn.execute(statement, params)
        conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER ALL")
        for _, definition in indexes:
            conn.execute(definition)
    conn.execute("VACUUM ANALYZE")
