"""One load client of the ingest benchmark (no Django): posts 1,000-signal batches until a deadline.

    BENCH_API_TOKEN=KEY python bench/ingest_client.py http http://127.0.0.1:PORT --client 0 --start T0 --end T1
    python bench/ingest_client.py sql postgres://127.0.0.1:5432/DB --sender-id 1 --client 0 --start T0 --end T1

``http`` posts to ``/api/signals/``; ``sql`` is the floor, the same rows bulk-inserted with plain
psycopg (``INSERT … SELECT FROM unnest``, one transaction a batch, default parameters). Every other
signal carries an idempotency key, unique across clients and requests. Requests go out back to back;
those that complete within [start, end] (epoch seconds) are counted. Prints one line of JSON.
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

from bench.pipeline_floor import KINDS, SIGNAL_TABLE, WEIGHTS

BATCH = 1_000
TEMPLATES = 4  # distinct batches per client, reused with new keys
REQUEST_MARK = "@@@@@@@@"  # 8 characters, replaced by the request number in each key
INSERT_SQL = (
    f"INSERT INTO {SIGNAL_TABLE} (sender_id, received_at, outcome, user_id, item_id, kind, weight, occurred_at,"
    " idempotency_key) SELECT %s, now(), 0, u.* FROM unnest(%s::bigint[], %s::bigint[], %s::varchar[],"
    " %s::float8[], %s::timestamptz[], %s::varchar[]) AS u"
)


def template(rng: random.Random, client: int, now: datetime) -> list[tuple[int, int, str, float, datetime, str | None]]:
    """One batch: (user_id, item_id, kind, weight, occurred_at, key with REQUEST_MARK or None)."""
    return [
        (
            rng.randint(1, 500_000),
            rng.randint(1, 5_000),
            rng.choice(KINDS),
            rng.choice(WEIGHTS),
            now - timedelta(microseconds=rng.randrange(6 * 3_600_000_000)),
            f"c{client:03d}-{REQUEST_MARK}-{index:04d}" if index % 2 == 0 else None,
        )
        for index in range(BATCH)
    ]


def http_sender(args: argparse.Namespace, batches: list[list[Any]]) -> Callable[[int], int]:
    """A function that posts batch ``number`` (its keys stamped) and returns how many were accepted."""

    def signal(user_id: int, item_id: int, kind: str, weight: float, at: datetime, key: str | None) -> dict[str, Any]:
        occurred_at = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        fields = {"user_id": user_id, "item_id": item_id, "kind": kind, "weight": weight, "occurred_at": occurred_at}
        return fields | ({"idempotency_key": key} if key else {})

    compact = (",", ":")
    bodies = [
        json.dumps({"signals": [signal(*row) for row in batch]}, separators=compact).encode() for batch in batches
    ]
    url = urlsplit(args.target)
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
    import psycopg

    columns = [[list(column) for column in zip(*batch, strict=True)] for batch in batches]
    conn = psycopg.connect(args.target)  # closed when the process exits

    def send(number: int) -> int:
        users, items, kinds, weights, moments, keys = columns[number % len(columns)]
        keys = [key.replace(REQUEST_MARK, f"{number:08d}") if key else None for key in keys]
        with conn.cursor() as cursor:
            cursor.execute(INSERT_SQL, (args.sender_id, users, items, kinds, weights, moments, keys))
            inserted = cursor.rowcount
        conn.commit()
        return inserted

    return send


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("http", "sql"))
    parser.add_argument("target", help="the server's base URL (http) or the database URL (sql)")
    parser.add_argument("--sender-id", type=int, default=0)
    parser.add_argument("--client", type=int, required=True)
    parser.add_argument("--start", type=float, required=True, help="epoch seconds: counting starts")
    parser.add_argument("--end", type=float, required=True, help="epoch seconds: counting and sending stop")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed * 1_000 + args.client)
    now = datetime.now(UTC)
    batches = [template(rng, args.client, now) for _ in range(TEMPLATES)]
    send = (http_sender if args.mode == "http" else sql_sender)(args, batches)
    result: dict[str, Any] = {"signals": 0, "total_signals": 0, "errors": 0, "first_error": "", "latencies": []}
    number = 0
    while time.time() < args.end:
        sent = time.time()
        try:
            accepted = send(number)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            result["errors"] += 1
            result["first_error"] = result["first_error"] or f"{type(exc).__name__}: {exc}"[:500]
            time.sleep(0.05)
            continue
        finally:
            number += 1
        done = time.time()
        result["total_signals"] += accepted
        if args.start <= done <= args.end:
            result["signals"] += accepted
            result["latencies"].append(done - sent)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
