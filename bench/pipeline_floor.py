"""The pipeline benchmark's child processes without Django: the processing floor and the ingest load clients.

    python bench/pipeline_floor.py process [--paired bare_]    # budgets 1 and 1b: every pending signal
    python bench/pipeline_floor.py process --python-loop       # budget 1's Python-loop floor, for information
    python bench/pipeline_floor.py sql --sender-id 1 --client 0 --start T0 --end T1    # budget 3's floor
    BENCH_API_TOKEN=KEY python bench/pipeline_floor.py http --url http://127.0.0.1:PORT --client 0 --start T0 --end T1

The database is DATABASE_URL's and the batch SIGNAL_BATCH_SIZE's, as for the worker. Prints one line of JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.types.json import Jsonb

# The product's tables and codes (pipeline_phases.py checks them against the Django models).
SIGNAL_TABLE = "signals_app_signal"
AGGREGATE_TABLES = ("signals_app_communityaggregate", "signals_app_cohortaggregate")
MEMBER_TABLES = ("community_communitymember", "community_cohortmember")
GROUP_TABLES = ("community_community", "community_cohort")
LEAVE_TABLE = "community_communityleave"
TARGETS = ("community_id", "cohort_id")  # the member and aggregate tables' group column
ATTRIBUTED, GATED, NO_TARGET = 1, 2, 3
LEFT_AT_PROCESSING = 3  # GatedReason.LEFT_AT_PROCESSING
# The weights are binary fractions: their sums are exact in any order, so two pipelines write bit-identical sums.
KINDS = ("view", "like", "share", "comment")
WEIGHTS = (1.0, 1.0, 1.0, 2.0, 5.0, 0.5)

# The cache's rule: every record that is not a well-formed ACTIVE one gates its user.
GATED_SQL = f"SELECT user_id FROM {LEAVE_TABLE} WHERE NOT (octet_length(value) = 9 AND get_byte(value, 0) = 0)"


# Per batch, after the lock: one statement joins the passing signals with the memberships, locks the
# groups credited FOR KEY SHARE, once each, as the product's statement does (the aggregates have no
# foreign key to them; the groups' tables are never copied), upserts both aggregates (cohorts first,
# then communities, then the signals: each waits for the one before) and marks the outcomes with the
# evidence the product writes. {p} prefixes the tables: the product's, or their bare copies ("bare_").
CREDIT_SQL = """
WITH c_all AS (SELECT s.id, m.community_id AS target, s.item_id, s.kind, s.weight, s.occurred_at
        FROM {p}signals_app_signal s JOIN {p}community_communitymember m ON m.user_id = s.user_id
        WHERE s.id = ANY(%(passed)b)),
    c_groups AS (SELECT id FROM community_community WHERE id IN (SELECT target FROM c_all) ORDER BY id FOR KEY SHARE),
    c AS (SELECT * FROM c_all WHERE target IN (SELECT id FROM c_groups)),
    k_all AS (SELECT s.id, m.cohort_id AS target, s.item_id, s.kind, s.weight, s.occurred_at
        FROM {p}signals_app_signal s JOIN {p}community_cohortmember m ON m.user_id = s.user_id
        WHERE s.id = ANY(%(passed)b)),
    k_groups AS (SELECT id FROM community_cohort WHERE id IN (SELECT target FROM k_all) ORDER BY id FOR KEY SHARE),
    k AS (SELECT * FROM k_all WHERE target IN (SELECT id FROM k_groups)),
    ka AS (INSERT INTO {p}signals_app_cohortaggregate AS a (cohort_id, hour, item_id, kind, count, weight_sum, last_at)
        SELECT target, date_trunc('hour', occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', item_id, kind,
            count(*), sum(weight), max(occurred_at) FROM k GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (cohort_id, hour, item_id, kind) DO UPDATE SET count = a.count + excluded.count,
            weight_sum = a.weight_sum + excluded.weight_sum, last_at = GREATEST(a.last_at, excluded.last_at)
        RETURNING 1),
    ca AS (INSERT INTO {p}signals_app_communityaggregate AS a (community_id, hour, item_id, kind, count, weight_sum,
            last_at)
        SELECT target, date_trunc('hour', occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', item_id, kind,
            count(*), sum(weight), max(occurred_at) FROM c WHERE (SELECT count(*) FROM ka) >= 0
            GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
        ON CONFLICT (community_id, hour, item_id, kind) DO UPDATE SET count = a.count + excluded.count,
            weight_sum = a.weight_sum + excluded.weight_sum, last_at = GREATEST(a.last_at, excluded.last_at)
        RETURNING 1),
    t AS (SELECT u.id, u.reason, c.targets AS cs, k.targets AS ks
        FROM unnest(%(ids)b::bigint[], %(reasons)b::smallint[]) AS u(id, reason)
        LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM c GROUP BY id) c USING (id)
        LEFT JOIN (SELECT id, jsonb_agg(target ORDER BY target) AS targets FROM k GROUP BY id) k USING (id)),
    m AS (UPDATE {p}signals_app_signal s SET
        outcome = CASE WHEN t.reason IS NOT NULL THEN %(gated)b::smallint
            WHEN t.cs IS NULL AND t.ks IS NULL THEN %(no_target)b::smallint ELSE %(attributed)b::smallint END,
        gated_reason = t.reason,
        credited_communities = CASE WHEN t.cs IS NOT NULL OR t.ks IS NOT NULL THEN coalesce(t.cs, '[]'::jsonb) END,
        credited_cohorts = CASE WHEN t.cs IS NOT NULL OR t.ks IS NOT NULL THEN coalesce(t.ks, '[]'::jsonb) END,
        processed_at = %(now)b, fence_at_processing = %(fence)b
        FROM t WHERE s.id = t.id AND (SELECT count(*) FROM ca) >= 0 RETURNING 1)
SELECT count(*) FROM m"""
LOCK_SQL = (
    "SELECT {columns} FROM {p}signals_app_signal WHERE id = ANY(%b) AND outcome = 0 ORDER BY id FOR UPDATE SKIP LOCKED"
)
PENDING_SQL = "SELECT id FROM {p}signals_app_signal WHERE outcome = 0 ORDER BY id"


# The Python-loop floor, as a straightforward worker does it: after a lock that reads the signals'
# fields and one read of the batch's users' memberships, the gate and the sums in Python, then one
# upsert of each aggregate from arrays (rows in key order) and one mark with the same evidence as the
# set-based floor writes; no group locks.
MEMBERS_SQL = " UNION ALL ".join(
    f"SELECT {index}, user_id, {target} FROM {members} WHERE user_id = ANY(%(users)b)"
    for index, (members, target) in enumerate(zip(MEMBER_TABLES, TARGETS, strict=True))
)
UPSERT_SQL = [
    f"INSERT INTO {aggregate} AS a ({target}, hour, item_id, kind, count, weight_sum, last_at)"
    " SELECT * FROM unnest(%b::bigint[], %b::timestamptz[], %b::bigint[], %b::varchar[], %b::bigint[],"
    " %b::float8[], %b::timestamptz[])"
    f" ON CONFLICT ({target}, hour, item_id, kind) DO UPDATE SET count = a.count + excluded.count,"
    " weight_sum = a.weight_sum + excluded.weight_sum, last_at = GREATEST(a.last_at, excluded.last_at)"
    for aggregate, target in zip(AGGREGATE_TABLES, TARGETS, strict=True)
]
MARK_SQL = (
    f"UPDATE {SIGNAL_TABLE} s SET outcome = u.outcome, gated_reason = u.reason, credited_communities = u.cs,"
    " credited_cohorts = u.ks, processed_at = %b, fence_at_processing = 0"
    " FROM unnest(%b::bigint[], %b::smallint[], %b::smallint[], %b::jsonb[], %b::jsonb[])"
    " AS u(id, outcome, reason, cs, ks) WHERE s.id = u.id"
)


def credit_set(cursor: psycopg.Cursor[Any], prefix: str, ids: list[int], gated: set[int]) -> int:
    """One batch of the set-based floor, after the lock: the gate in Python, then CREDIT_SQL."""
    rows = cursor.execute(LOCK_SQL.format(columns="id, user_id", p=prefix), (ids,)).fetchall()
    passed = [signal_id for signal_id, user_id in rows if user_id not in gated]
    reasons = [LEFT_AT_PROCESSING if user_id in gated else None for _, user_id in rows]
    constants = {"fence": 0, "gated": GATED, "no_target": NO_TARGET, "attributed": ATTRIBUTED}
    params = {"passed": passed, "ids": [row[0] for row in rows], "reasons": reasons, "now": datetime.now(UTC)}
    cursor.execute(CREDIT_SQL.format(p=prefix), params | constants)
    return len(rows)


def credit_loop(cursor: psycopg.Cursor[Any], ids: list[int], gated: set[int]) -> int:
    """One batch of the Python-loop floor, after the lock."""
    columns = "id, user_id, item_id, kind, weight, occurred_at"
    rows = cursor.execute(LOCK_SQL.format(columns=columns, p=""), (ids,)).fetchall()
    members: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})  # of communities, of cohorts
    for table, user_id, target in cursor.execute(MEMBERS_SQL, {"users": list({row[1] for row in rows})}):
        members[table].setdefault(user_id, []).append(target)
    sums: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})  # (target, hour, item, kind) -> (count, sum, last)
    marks = []  # (id, outcome, reason, communities credited, cohorts credited)
    for signal_id, user_id, item_id, kind, weight, at in rows:
        if user_id in gated:
            marks.append((signal_id, GATED, LEFT_AT_PROCESSING, None, None))
            continue
        credited = [sorted(joined.get(user_id, ())) for joined in members]
        hour = at.replace(minute=0, second=0, microsecond=0)  # the session is in UTC
        for targets, increments in zip(credited, sums, strict=True):
            for target in targets:
                count, total, last = increments.get((target, hour, item_id, kind), (0, 0.0, at))
                increments[target, hour, item_id, kind] = (count + 1, total + weight, max(last, at))
        if any(credited):
            marks.append((signal_id, ATTRIBUTED, None, *map(Jsonb, credited)))
        else:
            marks.append((signal_id, NO_TARGET, None, None, None))
    for sql, increments in zip(UPSERT_SQL, sums, strict=True):
        if increments:
            written = sorted((*key, *value) for key, value in increments.items())
            cursor.execute(sql, [list(column) for column in zip(*written, strict=True)])
    cursor.execute(MARK_SQL, [datetime.now(UTC), *(list(column) for column in zip(*marks, strict=True))])
    return len(rows)


def process(paired: str, python_loop: bool) -> dict[str, Any]:
    """A floor over every pending signal, per batch one transaction, its users gated in Python from a set
    of left users read once; parameters in binary (``%b``). The set-based one, or with ``python_loop`` the
    Python-loop one. With ``paired``, the set-based floor on the tables of that prefix too, the two
    taking turns batch by batch (a pair of batches sees the same machine)."""
    prefixes = ["", paired] if paired else [""]
    size = int(os.environ["SIGNAL_BATCH_SIZE"])
    with psycopg.connect(os.environ["DATABASE_URL"], options="-c TimeZone=UTC") as conn:
        conn.execute("SELECT 1")  # connected and warm before the clock starts
        conn.commit()
        started = time.perf_counter()
        gated = {row[0] for row in conn.execute(GATED_SQL)}
        pending = {prefix: [row[0] for row in conn.execute(PENDING_SQL.format(p=prefix))] for prefix in prefixes}
        conn.commit()
        seconds = dict.fromkeys(prefixes, time.perf_counter() - started)  # each side pays the reads once
        processed = dict.fromkeys(prefixes, 0)
        for number, start in enumerate(range(0, max(map(len, pending.values())), size)):
            for prefix in prefixes[number % 2 :] + prefixes[: number % 2]:  # each side goes first in turn
                if not (ids := pending[prefix][start : start + size]):
                    continue
                started = time.perf_counter()
                with conn.cursor(binary=True) as cursor:
                    if python_loop:
                        processed[prefix] += credit_loop(cursor, ids, gated)
                    else:
                        processed[prefix] += credit_set(cursor, prefix, ids, gated)
                conn.commit()
                seconds[prefix] += time.perf_counter() - started
    answers = [{"processed": processed[prefix], "rate": processed[prefix] / seconds[prefix]} for prefix in prefixes]
    return answers[0] | ({"paired": answers[1]} if paired else {})


BATCH = 1_000
TEMPLATES = 4  # distinct batches per client, reused with new keys
REQUEST_MARK = "@@@@@@@@"  # 8 characters, replaced by the request number in each key
INSERT_SQL = (
    f"INSERT INTO {SIGNAL_TABLE} (sender_id, received_at, outcome, user_id, item_id, kind, weight, occurred_at,"
    " idempotency_key) SELECT %s, now(), 0, u.* FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[],"
    " %s::float8[], %s::timestamptz[], %s::varchar[]) AS u"
)


def http_sender(args: argparse.Namespace, batches: list[list[Any]]) -> Callable[[int], int]:
    """Posts batch ``number`` (its keys stamped) to /api/signals/; returns how many were accepted."""

    def signal(user_id: int, item_id: int, kind: str, weight: float, at: datetime, key: str | None) -> dict[str, Any]:
        occurred_at = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        fields = {"user_id": user_id, "item_id": item_id, "kind": kind, "weight": weight, "occurred_at": occurred_at}
        return fields | ({"idempotency_key": key} if key else {})

    compact = (",", ":")
    bodies = [
        json.dumps({"signals": [signal(*row) for row in batch]}, separators=compact).encode() for batch in batches
    ]
    url = urlsplit(args.url)
    # The token comes from the environment, not the command line, where any local user could read it.
    headers = {"Authorization": f"Token {os.environ['BENCH_API_TOKEN']}", "Content-Type": "application/json"}

    def send(number: int) -> int:
        body = bodies[number % len(bodies)].replace(REQUEST_MARK.encode(), b"%08d" % number)
        # gunicorn's sync workers close the connection after each response: one per request.
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
        try:
            conn.request("POST", "/api/signals/", body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        finally:
            conn.close()
        if response.status != 202:
            raise ValueError(f"HTTP {response.status}: {payload[:300]!r}")
        answer = json.loads(payload)
        if answer.get("duplicates"):
            raise ValueError(f"unexpected duplicates: {answer}")
        return int(answer["accepted"])

    return send


def sql_sender(args: argparse.Namespace, batches: list[list[Any]]) -> Callable[[int], int]:
    """Inserts batch ``number`` (its keys stamped) with psycopg's default parameters, one transaction."""
    columns = [[list(column) for column in zip(*batch, strict=True)] for batch in batches]
    conn = psycopg.connect(os.environ["DATABASE_URL"])  # closed when the process exits

    def send(number: int) -> int:
        users, items, kinds, weights, moments, keys = columns[number % len(columns)]
        keys = [key.replace(REQUEST_MARK, f"{number:08d}") if key else None for key in keys]
        with conn.cursor() as cursor:
            cursor.execute(INSERT_SQL, (args.sender_id, users, items, kinds, weights, moments, keys))
            inserted = cursor.rowcount
        conn.commit()
        return inserted

    return send


def ingest(args: argparse.Namespace) -> dict[str, Any]:
    """Send 1,000-signal batches back to back until ``end``, every other signal with a key unique
    across clients and requests; those that complete within [start, end] are counted."""
    rng = random.Random(args.seed * 1_000 + args.client)
    now = datetime.now(UTC)
    batches = [
        [
            (
                rng.randint(1, 500_000),
                rng.randint(1, 5_000),
                rng.choice(KINDS),
                rng.choice(WEIGHTS),
                now - timedelta(microseconds=rng.randrange(6 * 3_600_000_000)),
                f"c{args.client:03d}-{REQUEST_MARK}-{index:04d}" if index % 2 == 0 else None,
            )
            for index in range(BATCH)
        ]
        for _ in range(TEMPLATES)
    ]
    send = (http_sender if args.mode == "http" else sql_sender)(args, batches)
    result: dict[str, Any] = {"signals": 0, "total_signals": 0, "errors": 0, "first_error": ""}
    number = 0
    while time.time() < args.end:
        try:
            accepted = send(number)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            result["errors"] += 1
            result["first_error"] = result["first_error"] or f"{type(exc).__name__}: {exc}"[:500]
            time.sleep(0.05)
            continue
        finally:
            number += 1
        result["total_signals"] += accepted
        if args.start <= time.time() <= args.end:
            result["signals"] += accepted
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("process", "sql", "http"))
    parser.add_argument("--paired", default="", help="process: the same floor on the tables of this prefix too")
    parser.add_argument("--python-loop", action="store_true", help="process: the Python-loop floor")
    parser.add_argument("--url", help="http: the server's base URL")
    parser.add_argument("--sender-id", type=int, help="sql: the signals' sender")
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start", type=float, help="epoch seconds: counting starts")
    parser.add_argument("--end", type=float, help="epoch seconds: counting and sending stop")
    args = parser.parse_args(argv)
    if args.python_loop and args.paired:
        parser.error("--python-loop runs on the project's tables only: it cannot be --paired")
    print(json.dumps(process(args.paired, args.python_loop) if args.mode == "process" else ingest(args)))


if __name__ == "__main__":
    main(sys.argv[1:])
