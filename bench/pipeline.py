"""Measure the signal pipeline's budgets against floors taken in the same run; see bench/pipeline.md.

    python bench/pipeline.py            # 200,000 signals, 2 rounds, 20 s of ingest in 4 slices: 8 to 25 minutes
    python bench/pipeline.py --quick    # 60,000 signals, 1 round, 5 s of ingest: a smoke run

Uses a Redis database of its own (15: the drills use 2 to 13), flushed before and after.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from support.processes import Children

SIZES = {
    "signals": (60_000, 200_000),
    "users": (10_000, 50_000),
    "rounds": (1, 2),
    "ingest_seconds": (5.0, 20.0),
    "ingest_slices": (1, 4),
}


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="60,000 signals, 1 round, 5 s of ingest: a smoke run")
    add = parser.add_argument
    add("--signals", type=int, help="pending signals to process (default 200,000; 60,000 quick)")
    add("--users", type=int, help="users (default 50,000; 10,000 quick)")
    add("--rounds", type=int, help="floor/worker pairs for budget 1, alternated (default 2; 1 quick)")
    add("--ingest-seconds", type=float, help="counted seconds of ingest (default 20; 5 quick)")
    add("--ingest-slices", type=int, help="turns the floor and the API take in ingest (default 4; 1 quick)")
    add("--ingest-clients", type=int, default=4, help="load client processes (default 4)")
    add("--ingest-workers", type=int, help="gunicorn sync workers (default 2 x CPUs + 1, as deploy/gunicorn.conf.py)")
    add("--broker", default="redis://127.0.0.1:6379/15", help="Redis URL with a database number of its own")
    args = common.parse(parser, argv, SIZES)
    args.ingest_workers = args.ingest_workers or 2 * len(os.sched_getaffinity(0)) + 1
    if args.signals < 20_000:
        parser.error("--signals must be at least 20,000 (budget 2 profiles up to 40 batches of 500)")
    import celery
    import gunicorn
    import kombu
    import redis

    broker = redis.Redis.from_url(args.broker)
    broker.flushdb()
    redis_version = broker.info()["redis_version"]
    parts = urlsplit(args.broker)
    shown_broker = f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"  # no password
    load_before = os.getloadavg()[0]
    env = {"CELERY_BROKER_URL": args.broker, "SIGNAL_BATCH_SIZE": "500", "DEBUG": "false", "LOG_LEVEL": "WARNING"}
    try:
        with common.database("tidal_bench_pipeline", args.server, env) as url, Children() as children:
            import psycopg

            from bench import pipeline_phases as phases

            with psycopg.connect(url, autocommit=True, options="-c TimeZone=UTC") as conn:
                facts = [
                    fact for fact in common.machine(conn) if fact[0] not in ("settings", "LEAVE_CACHE_REWARM_AFTER")
                ]
                common.progress(f"making {args.users:,} users' memberships, leaves, {args.signals:,} signals")
                data = phases.create(conn, args.signals, args.users, args.seed)
                bench = phases.PipelineBench(conn=conn, data=data, args=args, broker=broker, children=children)
                bench.throughput()  # the rows come in the order of their numbers
                bench.gate_share()
                bench.ingest()
    finally:
        try:
            broker.flushdb()
        except redis.RedisError as exc:  # e.g. Redis restarted under us: say so, keep the first error
            print(f"could not flush the broker's database {shown_broker}: {exc}", file=sys.stderr)

    per_user = [sum(map(len, groups.values())) / args.users for groups in (data.communities, data.cohorts)]
    load = f"{load_before:.2f} at the start; {os.getloadavg()[0]:.2f} at the end, its own processes included"
    facts += [
        ("celery", f"{celery.__version__} (kombu {kombu.__version__}), broker Redis {redis_version}"),
        ("gunicorn", gunicorn.__version__),
        ("redis-py", redis.__version__),
        ("load average (1 min)", load),
        ("settings", f"{common.SETTINGS}, DEBUG=False, SIGNAL_BATCH_SIZE=500, LOG_LEVEL=WARNING"),
        ("broker", f"{shown_broker} (flushed before and after)"),
        (
            "data",
            f"{args.users:,} users in {phases.COMMUNITIES} communities ({per_user[0]:.2f} each on average) and"
            f" {phases.COHORTS} cohorts ({per_user[1]:.2f}), {len(data.left):,} left ({phases.LEFT_SHARE:.0%});"
            f" {args.signals:,} signals on {phases.ITEMS:,} items (Zipf), {len(phases.KINDS)} kinds, over"
            f" {phases.HOURS} hours",
        ),
    ]
    description = Path(__file__).with_name("pipeline.md").read_text().strip()  # the text above the results
    passed_text = "All the correctness checks listed above passed."
    markers = ("<!-- bench:pipeline:start -->", "<!-- bench:pipeline:end -->")
    return common.finish(args, "pipeline.py", argv, facts, bench, passed_text, markers, title=f"{description}\n\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
