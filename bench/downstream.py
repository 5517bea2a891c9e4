"""The change feed, the CSV export and webhook latency: figures for BENCHMARKS.md ("Downstream"), no budget.
Its own database (tidal_bench_downstream); the latency starts a real Celery worker on --broker."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, report
from bench.common import progress
from bench.tools import copy_records, status_kib
from support.processes import Children
from support.receiver import serve

DATABASE = "tidal_bench_downstream"
START, END = "<!-- downstream:begin -->", "<!-- downstream:end -->"
TITLE = """\
## Downstream: the change feed, the export, webhooks

Figures only, no budget (`make bench-downstream`), on cores shared with other work; PostgreSQL on loopback.
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


def bench_feed(changes: int, found: report.Results) -> None:
    """Median of 5 reads of the whole feed each way; each read must see every change."""
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

    for name, way, read_all in (
        (
            f"feed: read {changes:,} changes through the API, 1,000 a page (in-process client, median of 5)",
            "api",
            through_api,
        ),
        ("feed: the same through the selector only", "selector", through_selector),
    ):
        rounds, seen = [], set()
        for _ in range(5):
            started = time.perf_counter()
            seen.add(read_all())
            rounds.append(time.perf_counter() - started)
        found.check(seen == {changes}, f"the feed read {sorted(seen)} changes of {changes:,} ({way})")
        found.note(name, f"{statistics.median(rounds) * 1e3:,.0f} ms")


def bench_export(rows: int, changes: int, found: report.Results) -> None:
    """The export of every left user: the feed's leavers and ``rows - changes`` more by COPY."""
    import psycopg

    from community.membership import CommunityMembership, MembershipStatus, serialize_membership

    value = serialize_membership(CommunityMembership(0, MembershipStatus.LEFT, 1_700_000_000_000_000_000))
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        copy_records(conn, "community_communityleave", ((uid, value) for uid in range(changes, rows)))
    argv = [sys.executable, "-c", "from bench.downstream import child_export; child_export()"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, env=common.child_env())
    export = json.loads(done.stdout.splitlines()[-1])
    found.note(
        f"export: {export['rows']:,} left users as CSV ({export['mb']:,.0f} MB), streamed",
        f"{export['seconds']:,.1f} s",
    )
    found.note(
        "export: resident set rise while streaming (peak of the whole process)",
        f"{export['rss_rise_mb']:,.1f} MiB ({export['rss_peak_mb']:,.0f} MiB)",
    )


def bench_latency(samples: int, broker: str, found: report.Results) -> None:
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
    found.note(
        "webhook: from a leave call to its first delivery attempt at a healthy loopback receiver, "
        f"median ({len(latencies)} of {samples} leaves, 50 ms apart)",
        f"{statistics.median(latencies):,.1f} ms",
    )
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    found.note("webhook: the same, p99 (max)", f"{p99:,.1f} ms ({latencies[-1]:,.1f} ms)")


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
    found = report.Results()
    with common.database(DATABASE, args.server, env) as url:
        import psycopg

        with psycopg.connect(url) as conn:
            facts = common.machine(conn)
        progress("feed")
        bench_feed(args.feed_changes, found)
        progress("export")
        bench_export(args.export_rows, args.feed_changes, found)
        progress("latency")
        bench_latency(args.latency_samples, args.broker, found)
    passed_text = "Each read of the feed, both ways, saw every change."
    return common.finish(args, "downstream.py", argv, facts, found, passed_text, (START, END), TITLE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
