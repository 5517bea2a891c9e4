"""One load client of the ingest benchmark: posts 1,000-signal batches until a deadline.

Run by pipeline.py, a few at a time, each its own process (no Django here)::

    BENCH_API_TOKEN=KEY python bench/ingest_client.py http http://127.0.0.1:PORT --client 0 --start T0 --end T1
    python bench/ingest_client.py sql postgres://127.0.0.1:5432/DB --sender-id 1 --client 0 --start T0 --end T1

``http`` posts to ``/api/signals/``; ``sql`` is the floor, the same rows bulk-inserted with
plain psycopg (``INSERT … SELECT FROM unnest``, one transaction a batch), with psycopg's default
parameters; ``sql-binary`` is the same with the arrays as binary parameters. Every other signal
of a batch carries an idempotency key, unique across clients and requests, so every signal
is accepted. Requests go out back to back from the start; those that complete within
[start, end] (epoch seconds, the same window for every client) are counted. Prints one line
of JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

BATCH = 1_000
TEMPLATES = 4  # distinct batches per client, reused with new keys
REQUEST_MARK = "@@@@@@@@"  # 8 characters, replaced by the request number in each key
KINDS = ("view", "like", "share", "comment")
WEIGHTS = (1.0, 1.0, 1.0, 2.0, 5.0, 0.5)
SIGNAL_TABLE = "signals_app_signal"
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


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Window:
    """Counts what completes within [start, end]."""

    start: float
    end: float
    requests: int = 0
    signals: int = 0
    total_requests: int = 0
    total_signals: int = 0
    errors: int = 0
    first_error: str = ""
    latencies: list[float] = field(default_factory=list)

    def record(self, sent: float, done: float, accepted: int) -> None:
        self.total_requests += 1
        self.total_signals += accepted
        if self.start <= done <= self.end:
            self.requests += 1
            self.signals += accepted
            self.latencies.append(done - sent)

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what[:500]

    def result(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if key not in ("start", "end")}


def run_http(args: argparse.Namespace, batches: list[list[Any]], window: Window) -> None:
    url = urlsplit(args.target)
    bodies = [
        json.dumps(
            {
                "signals": [
                    {"user_id": u, "item_id": i, "kind": k, "weight": w, "occurred_at": rfc3339(at)}
                    | ({"idempotency_key": key} if key else {})
                    for u, i, k, w, at, key in batch
                ]
            },
            separators=(",", ":"),
        ).encode()
        for batch in batches
    ]
    # The token comes from the environment, not the command line, where any local user could read it.
    headers = {"Authorization": f"Token {os.environ['BENCH_API_TOKEN']}", "Content-Type": "application/json"}
    mark = REQUEST_MARK.encode()
    number = 0
    while time.time() < window.end:
        body = bodies[number % len(bodies)].replace(mark, b"%08d" % number)
        number += 1
        sent = time.time()
        # gunicorn's sync workers close the connection after each response: one per request.
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
        try:
            conn.request("POST", "/api/signals/", body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            window.error(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)
            continue
        finally:
            conn.close()
        done = time.time()
        if response.status != 202:
            window.error(f"HTTP {response.status}: {payload[:300]!r}")
            continue
        answer = json.loads(payload)
        if answer.get("duplicates"):
            window.error(f"unexpected duplicates: {answer}")
        window.record(sent, done, int(answer["accepted"]))


def run_sql(args: argparse.Namespace, batches: list[list[Any]], window: Window) -> None:
    import psycopg

    columns = [[list(column) for column in zip(*batch, strict=True)] for batch in batches]
    # sql: psycopg's default (text) parameters; sql-binary: the arrays in binary, as the API's insert sends them.
    statement = INSERT_SQL.replace("%s::", "%b::") if args.mode == "sql-binary" else INSERT_SQL
    with psycopg.connect(args.target) as conn:
        number = 0
        while time.time() < window.end:
            users, items, kinds, weights, moments, keys = columns[number % len(columns)]
            request = f"{number:08d}"
            keys = [key.replace(REQUEST_MARK, request) if key else None for key in keys]
            number += 1
            sent = time.time()
            with conn.cursor() as cursor:
                cursor.execute(statement, (args.sender_id, users, items, kinds, weights, moments, keys))
                inserted = cursor.rowcount
            conn.commit()
            window.record(sent, time.time(), inserted)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("http", "sql", "sql-binary"))
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
    window = Window(args.start, args.end)
    (run_http if args.mode == "http" else run_sql)(args, batches, window)
    print(json.dumps(window.result()))


if __name__ == "__main__":
    main(sys.argv[1:])
