"""The processing floor: the pipeline's database work, hand-written on plain psycopg.

No Django, no Celery. Run as its own process by pipeline.py, on the same pending signals
the worker gets, in the same batches (ids in order, SIGNAL_BATCH_SIZE each)::

    python bench/pipeline_floor.py postgres://127.0.0.1:5432/tidal_bench_pipeline --batch-size 500 [--set-based]

Each batch is one transaction; parameters go in binary (``%b``) and rows come back in binary.
The two floors are described in bench/pipeline.md. Prints one JSON line: the time the batches
took, and per phase.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

# The product's tables (pipeline.py checks these names against the Django models).
SIGNAL_TABLE = "signals_app_signal"
COMMUNITY_AGGREGATE_TABLE = "signals_app_communityaggregate"
COHORT_AGGREGATE_TABLE = "signals_app_cohortaggregate"
COMMUNITY_MEMBER_TABLE = "community_communitymember"
COHORT_MEMBER_TABLE = "community_cohortmember"
LEAVE_TABLE = "community_communityleave"
COMMUNITY_TABLE = "community_community"
COHORT_TABLE = "community_cohort"

ATTRIBUTED, GATED, NO_TARGET = 1, 2, 3
LEFT_AT_PROCESSING = 3  # GatedReason.LEFT_AT_PROCESSING

# The cache's rule: every record that is not a well-formed ACTIVE one gates its user.
GATED_SQL = f"SELECT user_id FROM {LEAVE_TABLE} WHERE NOT (octet_length(value) = 9 AND get_byte(value, 0) = 0)"
LOCK_SQL = (
    f"SELECT id, user_id, item_id, kind, weight, occurred_at FROM {SIGNAL_TABLE} "
    "WHERE id = ANY(%b) AND outcome = 0 ORDER BY id FOR UPDATE SKIP LOCKED"
)
MEMBERS_SQL = (
    f"SELECT false, user_id, community_id FROM {COMMUNITY_MEMBER_TABLE} WHERE user_id = ANY(%(users)b) "
    f"UNION ALL SELECT true, user_id, cohort_id FROM {COHORT_MEMBER_TABLE} WHERE user_id = ANY(%(users)b)"
)


def upsert_sql(table: str, target: str) -> str:
    return (
        f"INSERT INTO {table} AS t ({target}, hour, item_id, kind, count, weight_sum, last_at) "
        "SELECT * FROM unnest(%b::bigint[], %b::timestamptz[], %b::bigint[], %b::varchar[], %b::bigint[],"
        " %b::float8[], %b::timestamptz[]) "
        f"ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = t.count + excluded.count, "
        "weight_sum = t.weight_sum + excluded.weight_sum, last_at = GREATEST(t.last_at, excluded.last_at)"
    )


UPSERT_COMMUNITY_SQL = upsert_sql(COMMUNITY_AGGREGATE_TABLE, "community_id")
UPSERT_COHORT_SQL = upsert_sql(COHORT_AGGREGATE_TABLE, "cohort_id")
MARK_SQL = (
    f"UPDATE {SIGNAL_TABLE} AS s SET outcome = u.outcome, processed_at = %s "
    "FROM unnest(%b::bigint[], %b::smallint[]) AS u(id, outcome) WHERE s.id = u.id"
)

# (target id, hour, item id, kind) -> [count, weight sum, last time]
Increments = dict[tuple[int, datetime, int, str], list[Any]]


def add(
    increments: Increments, targets: Sequence[int], hour: datetime, item_id: int, kind: str, weight: float, at: datetime
) -> None:
    for target_id in targets:
        key = (target_id, hour, item_id, kind)
        row = increments.get(key)
        if row is None:
            increments[key] = [1, weight, at]
        else:
            row[0] += 1
            row[1] += weight
            if at > row[2]:
                row[2] = at


def columns(increments: Increments) -> list[list[Any]]:
    """Rows in key order (as the product writes them, so that workers cannot deadlock), by column."""
    rows = [(*key, *value) for key, value in sorted(increments.items())]
    return [list(column) for column in zip(*rows, strict=True)]


class Floor:
    """Per batch: lock it, read its users' memberships, gate and add up in Python, write."""

    PHASES = ("lock", "memberships", "python", "writes", "commit")

    def __init__(self, conn: psycopg.Connection[Any], gated: set[int]) -> None:
        self.conn, self.gated, self.processed = conn, gated, 0
        self.phases = dict.fromkeys(self.PHASES, 0.0)

    def account(self, rows: int, *moments: float) -> None:
        """The batch's ``rows``, and the seconds between its ``moments`` to each phase in turn."""
        self.processed += rows
        for name, (earlier, later) in zip(self.PHASES, itertools.pairwise(moments), strict=True):
            self.phases[name] += later - earlier

    def batch(self, ids: list[int]) -> None:
        conn, clock = self.conn, time.perf_counter
        started = clock()
        with conn.cursor(binary=True) as cursor:
            rows = cursor.execute(LOCK_SQL, (ids,)).fetchall()
            locked = clock()
            if not rows:
                conn.commit()
                return
            communities: dict[int, list[int]] = {}
            cohorts: dict[int, list[int]] = {}
            users = list({row[1] for row in rows})
            for is_cohort, user_id, target_id in cursor.execute(MEMBERS_SQL, {"users": users}):
                (cohorts if is_cohort else communities).setdefault(user_id, []).append(target_id)
            read = clock()

            gated, no_targets = self.gated, ()
            community_increments: Increments = {}
            cohort_increments: Increments = {}
            outcomes: list[int] = []
            for _, user_id, item_id, kind, weight, occurred_at in rows:
                if user_id in gated:
                    outcomes.append(GATED)
                    continue
                in_communities = communities.get(user_id, no_targets)
                in_cohorts = cohorts.get(user_id, no_targets)
                if not (in_communities or in_cohorts):
                    outcomes.append(NO_TARGET)
                    continue
                outcomes.append(ATTRIBUTED)
                hour = occurred_at.replace(minute=0, second=0, microsecond=0)
                add(community_increments, in_communities, hour, item_id, kind, weight, occurred_at)
                add(cohort_increments, in_cohorts, hour, item_id, kind, weight, occurred_at)
            computed = clock()

            with conn.pipeline():
                if community_increments:
                    cursor.execute(UPSERT_COMMUNITY_SQL, columns(community_increments))
                if cohort_increments:
                    cursor.execute(UPSERT_COHORT_SQL, columns(cohort_increments))
                cursor.execute(MARK_SQL, (datetime.now(UTC), [row[0] for row in rows], outcomes))
            written = clock()
        conn.commit()
        self.account(len(rows), started, locked, read, computed, written, clock())


# --- the set-based floor ------------------------------------------------------------------------


def set_credit_sql(prefix: str) -> str:
    """Both aggregate upserts (GROUP BY joins of the batch with the memberships) and the
    outcomes with their evidence, in one statement, as the product writes them. ``prefix``
    names the tables: the product's, or their bare copies ("bare_")."""
    signal, members = f"{prefix}{SIGNAL_TABLE}", (f"{prefix}{COMMUNITY_MEMBER_TABLE}", f"{prefix}{COHORT_MEMBER_TABLE}")
    aggregates = (f"{prefix}{COMMUNITY_AGGREGATE_TABLE}", f"{prefix}{COHORT_AGGREGATE_TABLE}")
    hour = "date_trunc('hour', occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    # The groups credited locked FOR KEY SHARE, once each, as the product's statement does (the
    # aggregates have no foreign key to them); the groups' tables are never copied.
    joined = [
        f"{name}_all AS (SELECT s.id, m.{target} AS target, s.item_id, s.kind, s.weight, s.occurred_at"
        f" FROM {signal} s JOIN {table} m ON m.user_id = s.user_id WHERE s.id = ANY(%(passed)b)),"
        f" {name}_groups AS (SELECT id FROM {groups} WHERE id IN (SELECT target FROM {name}_all) ORDER BY id"
        f" FOR KEY SHARE), {name} AS (SELECT * FROM {name}_all WHERE target IN (SELECT id FROM {name}_groups))"
        for name, table, target, groups in (
            ("c", members[0], "community_id", COMMUNITY_TABLE),
            ("k", members[1], "cohort_id", COHORT_TABLE),
        )
    ]
    upserts = [
        f"{name} AS (INSERT INTO {table} AS a ({target}, hour, item_id, kind, count, weight_sum, last_at)"
        f" SELECT target, {hour}, item_id, kind, count(*), sum(weight), max(occurred_at) FROM {source}"
        f" WHERE {after} GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 ON CONFLICT ({target}, hour, item_id, kind)"
        " DO UPDATE SET count = a.count + excluded.count, weight_sum = a.weight_sum + excluded.weight_sum,"
        " last_at = GREATEST(a.last_at, excluded.last_at) RETURNING 1)"
        for name, table, target, source, after in (
            ("ka", aggregates[1], "cohort_id", "k", "true"),
            ("ca", aggregates[0], "community_id", "c", "(SELECT count(*) FROM ka) >= 0"),
        )
    ]
    return (
        "WITH "
        + ", ".join(
            [
                *joined,
                *upserts,
                "t AS (SELECT u.id, u.reason, c.targets AS cs, k.targets AS ks"
                " FROM unnest(%(ids)b::bigint[], %(reasons)b::smallint[]) AS u(id, reason)"
                " LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM c GROUP BY id) c USING (id)"
                " LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM k GROUP BY id) k USING (id))",
                f"m AS (UPDATE {signal} s SET outcome = CASE WHEN t.reason IS NOT NULL THEN %(gated)b::smallint"
                " WHEN t.cs IS NULL AND t.ks IS NULL THEN %(no_target)b::smallint ELSE %(attributed)b::smallint END,"
                " gated_reason = t.reason,"
                " credited_communities = CASE WHEN t.cs IS NOT NULL OR t.ks IS NOT NULL"
                " THEN coalesce(t.cs, '[]'::jsonb) END,"
                " credited_cohorts = CASE WHEN t.cs IS NOT NULL OR t.ks IS NOT NULL"
                " THEN coalesce(t.ks, '[]'::jsonb) END,"
                " processed_at = %(now)b, fence_at_processing = %(fence)b"
                " FROM t WHERE s.id = t.id AND (SELECT count(*) FROM ca) >= 0 RETURNING 1)",
            ]
        )
        + " SELECT count(*) FROM m"
    )


# The set-based statement's other parameters: the outcome codes, and no fence.
CONSTANTS = {"fence": 0, "gated": GATED, "no_target": NO_TARGET, "attributed": ATTRIBUTED}


class SetFloor(Floor):
    """Per batch: lock it, gate its users in Python from a set, one statement for the rest."""

    PHASES = ("lock", "python", "writes", "commit")

    def __init__(self, conn: psycopg.Connection[Any], gated: set[int], prefix: str) -> None:
        super().__init__(conn, gated)
        self.lock_sql = (
            f"SELECT id, user_id FROM {prefix}{SIGNAL_TABLE} WHERE id = ANY(%b) AND outcome = 0"
            " ORDER BY id FOR UPDATE SKIP LOCKED"
        )
        self.credit_sql = set_credit_sql(prefix)

    def batch(self, ids: list[int]) -> None:
        conn, clock = self.conn, time.perf_counter
        started = clock()
        with conn.cursor(binary=True) as cursor:
            rows = cursor.execute(self.lock_sql, (ids,)).fetchall()
            locked = clock()
            gated = self.gated
            passed = [signal_id for signal_id, user_id in rows if user_id not in gated]
            reasons = [LEFT_AT_PROCESSING if user_id in gated else None for _, user_id in rows]
            computed = clock()
            ids = [row[0] for row in rows]
            now = datetime.now(UTC)
            cursor.execute(self.credit_sql, {**CONSTANTS, "passed": passed, "ids": ids, "reasons": reasons, "now": now})
            written = clock()
        conn.commit()
        self.account(len(rows), started, locked, computed, written, clock())


def run(url: str, batch_size: int, *, set_based: bool = False, prefix: str = "", paired: str = "") -> dict[str, Any]:
    """The floor over every pending signal; with ``paired``, the same floor on the tables of
    that prefix too, the two taking turns batch by batch (this machine's speed drifts by
    tens of percent within minutes: a pair of batches sees the same machine)."""
    with psycopg.connect(url, options="-c TimeZone=UTC") as conn:
        conn.execute("SELECT 1")  # connected and warm before the clock starts
        conn.commit()
        started = time.perf_counter()
        names = [prefix, paired] if paired else [prefix]
        with conn.cursor() as cursor:
            gated = {row[0] for row in cursor.execute(GATED_SQL)}
            pending = {}
            for name in names:
                cursor.execute(f"SELECT id FROM {name}{SIGNAL_TABLE} WHERE outcome = 0 ORDER BY id")
                pending[name] = [row[0] for row in cursor]
        conn.commit()
        read_once = time.perf_counter() - started
        floors = {name: SetFloor(conn, gated, name) if set_based else Floor(conn, gated) for name in names}
        for number, start in enumerate(range(0, max(map(len, pending.values())), batch_size)):
            for name in names[number % 2 :] + names[: number % 2]:  # each side goes first in turn
                if batch := pending[name][start : start + batch_size]:
                    floors[name].batch(batch)

    def answer(name: str) -> dict[str, Any]:
        floor = floors[name]
        return {
            "seconds": read_once + sum(floor.phases.values()),
            "read_once_seconds": read_once,
            "processed": floor.processed,
            "batches": -(-len(pending[name]) // batch_size),
            "gated_users": len(gated),
            "phases": floor.phases,
        }

    return answer(prefix) | ({"paired": answer(paired)} if paired else {})


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database_url")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--set-based", action="store_true", help="the set-based floor (one statement a batch)")
    parser.add_argument("--prefix", default="", help="table name prefix: bare_ for the bare copies")
    parser.add_argument("--paired", default="", help="the same floor on these tables too, batch by batch in turn")
    args = parser.parse_args(argv)
    floor = run(args.database_url, args.batch_size, set_based=args.set_based, prefix=args.prefix, paired=args.paired)
    print(json.dumps(floor))


if __name__ == "__main__":
    main(sys.argv[1:])
