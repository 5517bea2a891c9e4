"""Measure the signal pipeline's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/pipeline.py            # 200,000 signals, 2 rounds, 20 s of ingest in 4 slices: 5 to 15 minutes
    python bench/pipeline.py --quick    # 60,000 signals, 1 round, 5 s of ingest: a smoke run

The budgets, floors and method are bench/pipeline.md (the text above its section of
BENCHMARKS.md). Uses its own Redis database number (15: the drills use 2 to 13), flushed before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, report
from support.processes import Children

DATABASE = "tidal_bench_pipeline"
START, END = "<!-- bench:pipeline:start -->", "<!-- bench:pipeline:end -->"
DESCRIPTION = Path(__file__).with_name("pipeline.md")  # the text above the results: what, how, notes
SIZES = {
    "signals": (60_000, 200_000),
    "users": (10_000, 50_000),
    "rounds": (1, 2),
    "ingest_seconds": (5.0, 20.0),
    "ingest_slices": (1, 4),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
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
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    import celery
    import gunicorn
    import kombu
    import redis

    broker = redis.Redis.from_url(args.broker)
    broker.flushdb()
    redis_version = broker.info()["redis_version"]
    load_before = os.getloadavg()[0]
    env = {"CELERY_BROKER_URL": args.broker, "SIGNAL_BATCH_SIZE": "500", "DEBUG": "false", "LOG_LEVEL": "WARNING"}
    try:
        with common.database(DATABASE, args.server, env) as url, Children() as children:
            import psycopg
            from django.contrib.auth import get_user_model

            from bench import pipeline_data
            from bench.pipeline_phases import PipelineBench

            with psycopg.connect(url, autocommit=True, options="-c TimeZone=UTC") as conn:
                facts = [
                    fact for fact in common.machine(conn) if fact[0] not in ("settings", "LEAVE_CACHE_REWARM_AFTER")
                ]
                common.progress(f"making {args.users:,} users' memberships, leaves, {args.signals:,} signals")
                sender = get_user_model().objects.create_user(username="bench-sender")
                data = pipeline_data.create(conn, args.signals, args.users, args.seed, sender.pk)
                bench = PipelineBench(conn, data, args, common.child_env(), broker, children)
                bench.run()
    finally:
        try:
            broker.flushdb()
        except redis.RedisError as exc:  # e.g. Redis restarted under us: say so, keep the first error
            print(f"could not flush the broker's database {redact(args.broker)}: {exc}", file=sys.stderr)

    per_user = [sum(map(len, groups.values())) / args.users for groups in (data.communities, data.cohorts)]
    facts += [
        ("celery", f"{celery.__version__} (kombu {kombu.__version__}), broker Redis {redis_version}"),
        ("gunicorn", gunicorn.__version__),
        ("redis-py", redis.__version__),
        (
            "load average (1 min)",
            f"{load_before:.2f} at the start; {os.getloadavg()[0]:.2f} at the end, its own processes included",
        ),
        ("settings", f"{common.SETTINGS}, DEBUG=False, SIGNAL_BATCH_SIZE=500, LOG_LEVEL=WARNING"),
        ("broker", f"{redact(args.broker)} (flushed before and after)"),
        (
            "data",
            f"{args.users:,} users in {pipeline_data.COMMUNITIES} communities ({per_user[0]:.2f} each on"
            f" average) and {pipeline_data.COHORTS} cohorts ({per_user[1]:.2f}), {len(data.left):,} left"
            f" ({pipeline_data.LEFT_SHARE:.0%}); {args.signals:,} signals on {pipeline_data.ITEMS:,} items (Zipf),"
            f" {len(pipeline_data.KINDS)} kinds, over {pipeline_data.HOURS} hours",
        ),
    ]
    command = common.command_line("pipeline.py", argv)
    checks = common.checks_text(bench.failed_checks, "All the correctness checks listed above passed.")
    tables = (("Budgets", bench.budgets), ("For information", bench.info))
    parts = [(title, report.markdown_table(rows)) for title, rows in tables] + [("Checks", checks)]
    printed = [report.text_table(title.upper(), rows) for title, rows in tables]
    section = partial(common.results_section, command, facts, parts, bench.passed, description=DESCRIPTION, level=3)
    return common.conclude(args, command, printed, bench.failed_checks, bench.passed, section, (START, END))


def redact(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
