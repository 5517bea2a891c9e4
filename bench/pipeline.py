"""Measure the signal pipeline's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/pipeline.py            # 200,000 signals, 2 rounds, 20 s of ingest in 4 slices: 10 to 20 minutes
    python bench/pipeline.py --quick    # 60,000 signals, 1 round, 5 s of ingest: a smoke run

The budgets, floors and method are bench/pipeline.md (the text above its section of
BENCHMARKS.md). Uses its own Redis database number (15: the drills use 2 to 13), flushed before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
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
    add("--no-extras", action="store_true", help="skip the cost of each index and constraint (one floor run each)")
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
    load_before = os.getloadavg()
    env = {"CELERY_BROKER_URL": args.broker, "SIGNAL_BATCH_SIZE": "500", "DEBUG": "false", "LOG_LEVEL": "WARNING"}
    try:
        with common.database(DATABASE, args.server, env) as url, Children() as children:
            import psycopg
            from django.contrib.auth import get_user_model

            from bench import pipeline_data, report
            from bench.pipeline_phases import Options, PipelineBench

            shape = pipeline_data.Shape(
                signals=args.signals,
                users=args.users,
                communities=100,
                cohorts=30,
                items=5_000,
                hours=24,
                left_share=0.10,
                max_communities=6,  # 0..6: 3 on average
                max_cohorts=4,  # 0..4: 2 on average
                seed=args.seed,
            )
            options = Options(
                rounds=args.rounds,
                profile_batches=30 if args.quick else 100,
                cprofile_batches=5 if args.quick else 20,
                ingest_seconds=args.ingest_seconds,
                ingest_slices=args.ingest_slices,
                ingest_warmup=2.0 if args.quick else 3.0,
                ingest_clients=args.ingest_clients,
                ingest_workers=args.ingest_workers,
                seed=args.seed,
                extras=not args.no_extras,
            )
            with psycopg.connect(url, autocommit=True, options="-c TimeZone=UTC") as conn:
                facts = [
                    fact for fact in common.machine(conn) if fact[0] not in ("settings", "LEAVE_CACHE_REWARM_AFTER")
                ]
                celery_version = f"{celery.__version__} (kombu {kombu.__version__})"
                facts += [("celery", f"{celery_version}, broker Redis {broker.info()['redis_version']}")]
                facts += [("gunicorn", gunicorn.__version__), ("redis-py", redis.__version__)]
                common.progress(f"making {shape.users:,} users' memberships, leaves, {shape.signals:,} signals")
                sender = get_user_model().objects.create_user(username="bench-sender")
                data = pipeline_data.create(conn, shape, sender.pk)
                bench = PipelineBench(conn, data, options, common.child_env(), broker, children)
                bench.run()
    finally:
        try:
            broker.flushdb()
        except redis.RedisError as exc:  # e.g. Redis restarted under us: say so, keep the first error
            print(f"could not flush the broker's database {redact(args.broker)}: {exc}", file=sys.stderr)

    load_after = os.getloadavg()
    facts += [
        (
            "load average (1 min)",
            f"{load_before[0]:.2f} at the start; {load_after[0]:.2f} at the end, this benchmark's server and clients "
            "included",
        ),
        ("settings", f"{common.SETTINGS}, DEBUG=False, SIGNAL_BATCH_SIZE=500, LOG_LEVEL=WARNING"),
        ("broker", f"{redact(args.broker)} (flushed before and after)"),
        (
            "data",
            f"{shape.users:,} users in {shape.communities} communities ({data.community_memberships / shape.users:.2f} "
            f"each on average) and {shape.cohorts} cohorts ({data.cohort_memberships / shape.users:.2f}), "
            f"{len(data.left):,} left ({shape.left_share:.0%}); {shape.signals:,} signals on {shape.items:,} items "
            f"(Zipf), {len(pipeline_data.KINDS)} kinds, over {shape.hours} hours",
        ),
    ]
    command = common.command_line("pipeline.py", argv)
    passed = bench.passed
    checks = common.checks_text(
        bench.failed_checks,
        "All correctness checks passed (the floor's aggregates and outcomes equal the expected ones, the "
        "worker's equal the floor's, nothing left pending or queued, every ingest request accepted and stored).",
    )
    parts = [
        ("Budgets", report.markdown_table(bench.budgets)),
        ("For information", report.markdown_table(bench.info)),
        (
            "Profile of signals_process (cProfile of further batches, in the benchmark's process)",
            f"```\n{bench.profile_text}\n```",
        ),
        ("Checks", checks),
    ]
    printed = [
        report.text_table("BUDGETS", bench.budgets),
        report.text_table("FOR INFORMATION", bench.info),
        f"PROFILE of signals_process (cProfile of further batches, in this process)\n{bench.profile_text}",
    ]
    section = lambda: common.results_section(command, facts, parts, passed, description=DESCRIPTION, level=3)  # noqa: E731
    return common.conclude(args, command, printed, bench.failed_checks, passed, section, (START, END))


def redact(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
