"""The change feed, the CSV export and webhook latency: figures for BENCHMARKS.md ("Downstream"), no budget.
Its own database (tidal_bench_downstream); the latency starts a real Celery worker on --broker."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import progress
from bench.tools import copy_records, status_kib
from support.processes import Children
from support.receiver import serve

DATABASE = "tidal_bench_downstream"
START, END = "<!-- downstream:begin -->", "<!-- downstream:end -->"
# A line that ends in a backslash goes on in the next: a row of the table is one line.
SECTION = """\
## Downstream: the change feed, the export, webhooks

Produced by `{command}` (`make bench-downstream`) on {now:%Y-%m-%d %H:%M} UTC, Python {python}, {machine}, \
{cores} cores shared with other work. PostgreSQL on loopback.

| what | figure |
|---|---|
| feed: read {feed_changes:,} changes through the API, 1,000 a page (in-process client, median of 5) \
| {api_ms:,.0f} ms |
| feed: the same through the selector only | {selector_ms:,.0f} ms |
| export: {rows:,} left users as CSV ({mb:,.0f} MB), streamed | {seconds:,.1f} s |
| export: resident set rise while streaming (peak of the whole process) | \
{rss_rise_mb:,.1f} MiB ({rss_peak_mb:,.0f} MiB) |
| webhook: from a leave call to its first delivery attempt at a healthy loopback receiver, \
median ({arrived} of {latency_samples} leaves, 50 ms apart) | {median_ms:,.1f} ms |
| webhook: the same, p99 (max) | {p99_ms:,.1f} ms ({max_ms:,.1f} ms) |

The latency runs from before the leave call (so it includes the leave's own transaction)
to the receiver reading the request: commit, the on-commit kick through Redis, a Celery
worker (prefork, 2 processes) claiming the subscriber, reading the history and signing."""


def logged_in_client() -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    return client


def child_export() -> None:
    """In a fresh process, so that the resident set is the export's: stream the export of every
    left user and print, as JSON, the seconds, the rows, the size and the resident set's rise."""
    import django

    django.setup()
    client = logged_in_client()
    client.get("/api/community-layer/", {"status": "left", "limit": 1})  # warm imports and the connection
    Path("/proc/self/clear_refs").write_text("5")  # resets the high-water mark VmHWM
    before = status_kib("VmRSS")
    started = time.perf_counter()
    lines = size = 0
    for chunk in client.get("/api/community-layer/export/", {"status": "left"}).streaming_content:
        lines += chunk.count(b"\n")
        size += len(chunk)
    figures = {"seconds": time.perf_counter() - started, "rows": lines - 1, "mb": size / 1e6}
    peak = status_kib("VmHWM")
    print(json.dumps({**figures, "rss_rise_mb": (peak - before) / 2**10, "rss_peak_mb": peak / 2**10}))


def bench_feed(changes: int, failed: list[str]) -> dict[str, float]:
    """Median seconds of 5 reads of the whole feed each way; each read must see every change."""
    from community.selectors import community_layer_changes
    from community.services.layer import bulk_leave_community_layer

    for start in range(0, changes, 1000):
        bulk_leave_community_layer(user_ids=range(start, min(changes, start + 1000)), reason="bench")
    client = logged_in_client()

    def through_api() -> int:
        after, seen, more = 0, 0, True
        while more:
            body = client.get("/api/community-layer/changes/", {"after": after, "limit": 1000}).json()
            seen += len(body["results"])
            after, more = body["next_after"], body["has_more"]
        return seen

    def through_selector() -> int:
        after, seen = 0, 0
        while entries := community_layer_changes(after=after, limit=1000):
            seen += len(entries)
            after = entries[-1].version
        return seen

    figures = {}
    for name, read_all in (("api_ms", through_api), ("selector_ms", through_selector)):
        rounds, seen = [], set()
        for _ in range(5):
            started = time.perf_counter()
            seen.add(read_all())
            rounds.append(time.perf_counter() - started)
        if seen != {changes}:
            failed.append(f"the feed read {sorted(seen)} changes of {changes:,} ({name.removesuffix('_ms')})")
        figures[name] = statistics.median(rounds) * 1e3
    return figures


def bench_export(rows: int, changes: int) -> dict[str, float]:
    """The export of every left user: the feed's leavers and ``rows - changes`` more by COPY."""
    import psycopg

    from community.membership import CommunityMembership, MembershipStatus, serialize_membership

    value = serialize_membership(CommunityMembership(0, MembershipStatus.LEFT, 1_700_000_000_000_000_000))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        copy_records(conn, "community_communityleave", ((uid, value) for uid in range(changes, rows)))
    argv = [sys.executable, "-c", "from bench.downstream import child_export; child_export()"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=common.child_env())
    return json.loads(done.stdout.splitlines()[-1])


def bench_latency(samples: int, broker: str) -> dict[str, Any]:
    import redis

    from community.services.layer import leave_community_layer
    from community.webhooks.subscriptions import webhook_subscription_create

    arrivals: dict[int, float] = {}  # the receiver's threads: dict.setdefault is atomic

    def receive(headers: dict[str, str], body: bytes) -> int:
        now = time.perf_counter()
        for change in json.loads(body)["data"]["changes"]:
            arrivals.setdefault(change["user_id"], now)
        return 204

    server = serve(receive, protocol="HTTP/1.1")
    webhook_subscription_create(name="bench", url=f"http://127.0.0.1:{server.server_address[1]}/")
    redis.Redis.from_url(broker).flushdb()
    argv = [sys.executable, "-m", "celery", "-A", "tidalproject", "worker", "--concurrency=2", "--loglevel=WARNING"]
    started: dict[int, float] = {}
    with Children() as children:
        children.start("worker", argv, env=common.child_env(), cwd=common.PROJECT_DIR)
        time.sleep(8)  # the worker starts and warms
        for uid in range(50_000_000, 50_000_000 + samples):
            started[uid] = time.perf_counter()
            leave_community_layer(user_id=uid)
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while len(arrivals) < samples and time.monotonic() < deadline:
            time.sleep(0.1)
    server.shutdown()
    latencies = sorted((arrivals[u] - t) * 1000 for u, t in started.items() if u in arrivals)
    return {
        "arrived": len(latencies),
        "median_ms": statistics.median(latencies),
        "p99_ms": latencies[max(0, int(len(latencies) * 0.99) - 1)],
        "max_ms": latencies[-1],
    }


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="50,000 rows, 2,000 changes, 20 samples: a smoke run")
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/6")
    parser.add_argument("--export-rows", type=int, help="default 1,000,000")
    parser.add_argument("--feed-changes", type=int, help="default 10,000")
    parser.add_argument("--latency-samples", type=int, help="default 200")
    sizes = {"export_rows": (50_000, 1_000_000), "feed_changes": (2_000, 10_000), "latency_samples": (20, 200)}
    args = common.parse(parser, argv, sizes)
    env = {"CELERY_BROKER_URL": args.broker, "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true"}
    env["ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"
    failed: list[str] = []
    with common.database(DATABASE, args.server, env):
        progress("feed")
        feed = bench_feed(args.feed_changes, failed)
        progress("export")
        export = bench_export(args.export_rows, args.feed_changes)
        progress("latency")
        latency = bench_latency(args.latency_samples, args.broker)

    command = common.command_line("downstream.py", argv)
    section = SECTION.format(
        command=command,
        now=datetime.datetime.now(datetime.UTC),
        python=platform.python_version(),
        machine=platform.machine(),
        cores=os.cpu_count(),
        **vars(args) | feed | export | latency,
    )
    section += "".join(f"\n\nCHECK FAILED: {what}" for what in failed)
    return common.conclude(args, command, [section], failed, not failed, lambda: section, (START, END))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
