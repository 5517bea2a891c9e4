"""The processing floor: the pipeline's database work, hand-written on plain psycopg.

No Django, no Celery. Run as its own process by pipeline.py, on the same pending signals
the worker gets, in the same batches (ids in order, SIGNAL_BATCH_SIZE each)::

    python bench/pipeline_floor.py postgres://127.0.0.1:5432/tidal_bench_pipeline --batch-size 500 [--paired bare_]

Per batch, one transaction: lock it, gate its users in Python from a set of left users read
once, then one statement for the rest (bench/pipeline.md). Parameters go in binary (``%b``).
Prints one line of JSON: the signals processed, and how many a second.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import psycopg

# The product's tables and codes (pipeline_data.py checks them against the Django models).
SIGNAL_TABLE = "signals_app_signal"
AGGREGATE_TABLES = ("signals_app_communityaggregate", "signals_app_cohortaggregate")
MEMBER_TABLES = ("community_communitymember", "community_cohortmember")
GROUP_TABLES = ("community_community", "community_cohort")
LEAVE_TABLE = "community_communityleave"
TARGETS = ("community_id", "cohort_id")  # the member and aggregate tables' group column
ATTRIBUTED, GATED, NO_TARGET = 1, 2, 3
LEFT_AT_PROCESSING = 3  # GatedReason.LEFT_AT_PROCESSING
# The signals' kinds and weights, here for the ingest clients, which run without Django too. The weights
# are binary fractions: their sums are exact in any order, so two pipelines write bit-identical sums.
KINDS = ("view", "like", "share", "comment")
WEIGHTS = (1.0, 1.0, 1.0, 2.0, 5.0, 0.5)

# The cache's rule: every record that is not a well-formed ACTIVE one gates its user.
GATED_SQL = f"SELECT user_id FROM {LEAVE_TABLE} WHERE NOT (octet_length(value) = 9 AND get_byte(value, 0) = 0)"


def credit_sql(prefix: str) -> str:
    """Both aggregate upserts (GROUP BY joins of the batch with the memberships) and the
    outcomes with their evidence, in one statement, as the product writes them. ``prefix``
    names the tables: the product's, or their bare copies ("bare_")."""
    signal = f"{prefix}{SIGNAL_TABLE}"
    hour = "date_trunc('hour', occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
    # The groups credited locked FOR KEY SHARE, once each, as the product's statement does (the
    # aggregates have no foreign key to them); the groups' tables are never copied.
    joined = [
        f"{name}_all AS (SELECT s.id, m.{target} AS target, s.item_id, s.kind, s.weight, s.occurred_at"
        f" FROM {signal} s JOIN {prefix}{members} m ON m.user_id = s.user_id WHERE s.id = ANY(%(passed)b)),"
        f" {name}_groups AS (SELECT id FROM {groups} WHERE id IN (SELECT target FROM {name}_all) ORDER BY id"
        f" FOR KEY SHARE), {name} AS (SELECT * FROM {name}_all WHERE target IN (SELECT id FROM {name}_groups))"
        for name, members, target, groups in zip("ck", MEMBER_TABLES, TARGETS, GROUP_TABLES, strict=True)
    ]
    # Cohorts first, then communities, then the signals: each waits for the one before.
    upserts = [
        f"{name} AS (INSERT INTO {prefix}{table} AS a ({target}, hour, item_id, kind, count, weight_sum, last_at)"
        f" SELECT target, {hour}, item_id, kind, count(*), sum(weight), max(occurred_at) FROM {source}"
        f" WHERE {after} GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4 ON CONFLICT ({target}, hour, item_id, kind)"
        " DO UPDATE SET count = a.count + excluded.count, weight_sum = a.weight_sum + excluded.weight_sum,"
        " last_at = GREATEST(a.last_at, excluded.last_at) RETURNING 1)"
        for name, table, target, source, after in (
            ("ka", AGGREGATE_TABLES[1], "cohort_id", "k", "true"),
            ("ca", AGGREGATE_TABLES[0], "community_id", "c", "(SELECT count(*) FROM ka) >= 0"),
        )
    ]
    targets = [
        f"LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM {name} GROUP BY id) {name} USING (id)"
        for name in "ck"
    ]
    credited = "CASE WHEN t.cs IS NOT NULL OR t.ks IS NOT NULL THEN coalesce(t.{}, '[]'::jsonb) END"
    marks = (
        f"m AS (UPDATE {signal} s SET outcome = CASE WHEN t.reason IS NOT NULL THEN %(gated)b::smallint"
        " WHEN t.cs IS NULL AND t.ks IS NULL THEN %(no_target)b::smallint ELSE %(attributed)b::smallint END,"
        f" gated_reason = t.reason, credited_communities = {credited.format('cs')},"
        f" credited_cohorts = {credited.format('ks')}, processed_at = %(now)b, fence_at_processing = %(fence)b"
        " FROM t WHERE s.id = t.id AND (SELECT count(*) FROM ca) >= 0 RETURNING 1)"
    )
    outcomes = (
        "t AS (SELECT u.id, u.reason, c.targets AS cs, k.targets AS ks"
        f" FROM unnest(%(ids)b::bigint[], %(reasons)b::smallint[]) AS u(id, reason) {' '.join(targets)})"
    )
    return f"WITH {', '.join([*joined, *upserts, outcomes, marks])} SELECT count(*) FROM m"


# The statement's other parameters: the outcome codes, and no fence.
CONSTANTS = {"fence": 0, "gated": GATED, "no_target": NO_TARGET, "attributed": ATTRIBUTED}


class Floor:
    """The floor on the tables named with ``prefix``: per batch, lock it, gate in Python, one statement."""

    def __init__(self, conn: psycopg.Connection[Any], gated: set[int], prefix: str) -> None:
        self.conn, self.gated, self.processed, self.seconds = conn, gated, 0, 0.0
        self.lock_sql = (
            f"SELECT id, user_id FROM {prefix}{SIGNAL_TABLE} WHERE id = ANY(%b) AND outcome = 0"
            " ORDER BY id FOR UPDATE SKIP LOCKED"
        )
        self.credit_sql = credit_sql(prefix)

    def batch(self, ids: list[int]) -> None:
        started = time.perf_counter()
        with self.conn.cursor(binary=True) as cursor:
            rows = cursor.execute(self.lock_sql, (ids,)).fetchall()
            passed = [signal_id for signal_id, user_id in rows if user_id not in self.gated]
            reasons = [LEFT_AT_PROCESSING if user_id in self.gated else None for _, user_id in rows]
            locked = [row[0] for row in rows]
            params = {**CONSTANTS, "passed": passed, "ids": locked, "reasons": reasons, "now": datetime.now(UTC)}
            cursor.execute(self.credit_sql, params)
        self.conn.commit()
        self.processed += len(rows)
        self.seconds += time.perf_counter() - started


def run(url: str, batch_size: int, paired: str = "") -> dict[str, Any]:
    """The floor over every pending signal; with ``paired``, the same floor on the tables of
    that prefix too, the two taking turns batch by batch (a pair of batches sees the same machine)."""
    names = ["", paired] if paired else [""]
    with psycopg.connect(url, options="-c TimeZone=UTC") as conn:
        conn.execute("SELECT 1")  # connected and warm before the clock starts
        conn.commit()
        started = time.perf_counter()
        gated = {row[0] for row in conn.execute(GATED_SQL)}
        pending = {
            name: [row[0] for row in conn.execute(f"SELECT id FROM {name}{SIGNAL_TABLE} WHERE outcome = 0 ORDER BY id")]
            for name in names
        }
        conn.commit()
        read_once = time.perf_counter() - started
        floors = {name: Floor(conn, gated, name) for name in names}
        for number, start in enumerate(range(0, max(map(len, pending.values())), batch_size)):
            for name in names[number % 2 :] + names[: number % 2]:  # each side goes first in turn
                if batch := pending[name][start : start + batch_size]:
                    floors[name].batch(batch)
    answers = [{"processed": f.processed, "rate": f.processed / (read_once + f.seconds)} for f in floors.values()]
    return answers[0] | ({"paired": answers[1]} if paired else {})


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database_url")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--paired", default="", help="the same floor on the tables of this prefix too, in turn")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.database_url, args.batch_size, args.paired)))


if __name__ == "__main__":
    main(sys.argv[1:])
