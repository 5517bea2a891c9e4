"""Downstream figures: the change feed, the CSV export and webhook latency; see BENCHMARKS.md.

    python bench/downstream.py              # writes the "Downstream" section of BENCHMARKS.md
    python bench/downstream.py --quick --no-write   # 50,000 rows, 2,000 changes: a smoke run, print only

Creates its own PostgreSQL database (tidal_bench_downstream), migrates it, and drops it at
the end. The webhook latency starts a real Celery worker (prefork, 2 processes) on the Redis
broker given by --broker and a loopback HTTP receiver. Reports; asserts no budget.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.tools import copy_records, status_kib
from support.processes import Children
from support.receiver import serve

DATABASE = "tidal_bench_downstream"
START, END = "<!-- downstream:begin -->", "<!-- downstream:end -->"


def _client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    return client


def child_export() -> None:
    """In a fresh process (the parent's environment): stream the export of every left user, print
    seconds, rows, RSS rise."""
    import django

    django.setup()
    client = _client()
    client.get("/api/community-layer/", {"status": "left", "limit": 1})  # warm imports and the connection
    Path("/proc/self/clear_refs").write_text("5")
    before = status_kib("VmRSS")
    started = time.perf_counter()
    response = client.get("/api/community-layer/export/", {"status": "left"})
    lines = size = 0
    for chunk in response.streaming_content:
        lines += chunk.count(b"\n")
        size += len(chunk)
    seconds = time.perf_counter() - started
    print(f"{seconds} {lines - 1} {size} {(status_kib('VmHWM') - before) * 1024} {status_kib('VmHWM') * 1024}")


def fill_changes(count: int) -> None:
    from community.services.layer import bulk_leave_community_layer

    for start in range(0, count, 1000):
        bulk_leave_community_layer(user_ids=range(start, min(count, start + 1000)), reason="bench")


def copy_left(count: int, offset: int) -> None:
    import psycopg

    from community.membership import CommunityMembership, MembershipStatus, serialize_membership

    value = serialize_membership(CommunityMembership(0, MembershipStatus.LEFT, 1_700_000_000_000_000_000))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        copy_records(conn, "community_communityleave", ((uid, value) for uid in range(offset, offset + count)))


def bench_feed(changes: int) -> dict[str, Any]:
    from community.selectors import community_layer_changes

    client = _client()
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        after, seen = 0, 0
        while True:
            body = client.get("/api/community-layer/changes/", {"after": after, "limit": 1000}).json()
            seen += len(body["results"])
            after = body["next_after"]
            if not body["has_more"]:
                break
        rounds.append(time.perf_counter() - started)
        assert seen == changes, seen
    selector = []
    for _ in range(5):
        started = time.perf_counter()
        after = 0
        while entries := community_layer_changes(after=after, limit=1000):
            after = entries[-1].version
        selector.append(time.perf_counter() - started)
    return {"api_seconds": statistics.median(rounds), "selector_seconds": statistics.median(selector)}


def bench_latency(samples: int, broker: str) -> dict[str, Any]:
    from community.services.layer import leave_community_layer
    from community.webhooks.subscriptions import webhook_subscription_create

    arrivals: dict[int, float] = {}
    lock = threading.Lock()

    def receive(headers: dict[str, str], body: bytes) -> int:
        now = time.perf_counter()
        with lock:
            for change in json.loads(body)["data"]["changes"]:
                arrivals.setdefault(change["user_id"], now)
        return 204

    server = serve(receive, protocol="HTTP/1.1")
    webhook_subscription_create(name="bench", url=f"http://127.0.0.1:{server.server_address[1]}/")
    import redis

    redis.Redis.from_url(broker).flushdb()
    argv = [sys.executable, "-m", "celery", "-A", "tidalproject", "worker", "--concurrency=2", "--loglevel=WARNING"]
    with Children() as children:
        children.start("worker", argv, env=common.child_env(), cwd=common.PROJECT_DIR)
        time.sleep(8)  # the worker starts and warms
        started: dict[int, float] = {}
        base = 50_000_000
        for index in range(samples):
            uid = base + index
            started[uid] = time.perf_counter()
            leave_community_layer(user_id=uid)
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while len(arrivals) < samples and time.monotonic() < deadline:
            time.sleep(0.1)
    server.shutdown()
    latencies = sorted((arrivals[u] - t) * 1000 for u, t in started.items() if u in arrivals)
    return {
        "samples": samples,
        "arrived": len(latencies),
        "median_ms": statistics.median(latencies),
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "max_ms": latencies[-1],
    }


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="50,000 rows, 2,000 changes, 20 samples: a smoke run")
    add = parser.add_argument
    add("--broker", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/6"))
    add("--export-rows", type=int, help="default 1,000,000")
    add("--feed-changes", type=int, help="default 10,000")
    add("--latency-samples", type=int, help="default 200")
    add("--child-export", action="store_true", help=argparse.SUPPRESS)
    sizes = {"export_rows": (50_000, 1_000_000), "feed_changes": (2_000, 10_000), "latency_samples": (20, 200)}
    args = common.parse(parser, argv, sizes)
    if args.child_export:
        child_export()
        return 0
    env = {"CELERY_BROKER_URL": args.broker, "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}
    env["ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"
    with common.database(DATABASE, args.server, env):
        fill_changes(args.feed_changes)
        feed = bench_feed(args.feed_changes)
        print("feed", feed, flush=True)
        copy_left(args.export_rows - args.feed_changes, offset=args.feed_changes)
        done = subprocess.run(
            [sys.executable, __file__, "--child-export"],
            capture_output=True,
            text=True,
            check=True,
            env=common.child_env(),
        )
        seconds, rows, size, rise, peak = done.stdout.split()[-5:]
        export = {
            "seconds": float(seconds),
            "rows": int(rows),
            "mb": int(size) / 1e6,
            "rss_rise_mb": int(rise) / 2**20,
            "rss_peak_mb": int(peak) / 2**20,
        }
        print("export", export, flush=True)
        latency = bench_latency(args.latency_samples, args.broker)
        print("latency", latency, flush=True)

    command = "python bench/downstream.py" + (" " + " ".join(argv) if argv else "")
    section = "\n".join(
        [
            "## Downstream: the change feed, the export, webhooks",
            "",
            "Produced by `" + command + "` (`make bench-downstream`) on "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
            f"{platform.machine()}, {os.cpu_count()} cores shared with other work. PostgreSQL on loopback.",
            "",
            "| what | figure |",
            "|---|---|",
            f"| feed: read {args.feed_changes:,} changes through the API, 1,000 a page "
            f"(in-process client, median of 5) | {feed['api_seconds'] * 1000:,.0f} ms |",
            f"| feed: the same through the selector only | {feed['selector_seconds'] * 1000:,.0f} ms |",
            f"| export: {export['rows']:,} left users as CSV ({export['mb']:,.0f} MB), streamed | "
            f"{export['seconds']:,.1f} s |",
            f"| export: resident set rise while streaming (peak of the whole process) | "
            f"{export['rss_rise_mb']:,.1f} MiB ({export['rss_peak_mb']:,.0f} MiB) |",
            f"| webhook: from a leave call to its first delivery attempt at a healthy loopback receiver, "
            f"median ({latency['arrived']} of {latency['samples']} leaves, 50 ms apart) | "
            f"{latency['median_ms']:,.1f} ms |",
            f"| webhook: the same, p99 (max) | {latency['p99_ms']:,.1f} ms ({latency['max_ms']:,.1f} ms) |",
            "",
            "The latency runs from before the leave call (so it includes the leave's own transaction)",
            "to the receiver reading the request: commit, the on-commit kick through Redis, a Celery",
            "worker (prefork, 2 processes) claiming the subscriber, reading the history and signing.",
        ]
    )
    print(section)
    if not args.no_write:
        from bench import report

        report.write_section(args.output, section, start=START, end=END)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
