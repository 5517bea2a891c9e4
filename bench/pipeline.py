"""Measure the signal pipeline's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/pipeline.py            # 200,000 signals, 2 rounds, 20 s of ingest: about 3 minutes
    python bench/pipeline.py --quick    # 60,000 signals, 1 round, 5 s of ingest: a smoke run

1. processing throughput of one real Celery worker (prefork, concurrency 1, Redis broker)
   against a plain-psycopg pipeline doing the same writes (bench/pipeline_floor.py);
2. the gate's and the fence's share of signals_process, profiled in this process;
3. signals accepted per second by POST /api/signals/ on gunicorn, against bare bulk inserts.

Creates its own PostgreSQL database (tidal_bench_pipeline) and uses its own Redis database
number (9), flushed before and after; drops and flushes them at the end and stops every
process it started, also on error, Ctrl-C or SIGTERM. Exits 1 when a budget is missed or a
correctness check fails.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_DIR))

from bench.run import machine, run_sql  # noqa: E402 - needs the path above

DATABASE = "tidal_bench_pipeline"
SETTINGS = "tidalproject.settings.dev"
START = "<!-- bench:pipeline:start -->"
END = "<!-- bench:pipeline:end -->"


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so that the finally clause stops the children and drops the database


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60,000 signals, 1 round, 5 s of ingest: a smoke run")
    parser.add_argument("--signals", type=int, help="pending signals to process (default 200,000; 60,000 quick)")
    parser.add_argument("--users", type=int, help="users (default 50,000; 10,000 quick)")
    parser.add_argument("--rounds", type=int, help="floor/worker pairs for budget 1, alternated (default 2; 1 quick)")
    parser.add_argument("--ingest-seconds", type=float, help="counted seconds of ingest (default 20; 5 quick)")
    parser.add_argument("--ingest-clients", type=int, default=4, help="load client processes (default 4)")
    parser.add_argument(
        "--ingest-workers",
        type=int,
        help="gunicorn sync workers (default 2 x CPUs + 1, as deploy/gunicorn.conf.py and gunicorn advise)",
    )
    parser.add_argument("--server", default="postgres://127.0.0.1:5432", help="PostgreSQL server URL, no database")
    parser.add_argument(
        "--broker", default="redis://127.0.0.1:6379/9", help="Redis URL with a database number of its own"
    )
    parser.add_argument("--output", type=Path, default=PROJECT_DIR / "BENCHMARKS.md", help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument(
        "--no-extras", action="store_true", help="skip the cost of each index and constraint (one floor run each)"
    )
    parser.add_argument("--seed", type=int, default=20_240_101)
    args = parser.parse_args(argv)
    defaults = {
        "signals": (60_000, 200_000),
        "users": (10_000, 50_000),
        "rounds": (1, 2),
        "ingest_seconds": (5.0, 20.0),
    }
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.ingest_workers is None:
        args.ingest_workers = 2 * len(os.sched_getaffinity(0)) + 1
    if args.signals < 20_000:
        parser.error("--signals must be at least 20,000 (budget 2 profiles up to 40 batches of 500)")
    return args


def command_line(argv: list[str]) -> str:
    python = Path(sys.executable)
    shown = python.relative_to(PROJECT_DIR) if python.is_relative_to(PROJECT_DIR) else python
    return shlex.join([str(shown), "bench/pipeline.py", *argv])  # run from the project folder


def versions(conn: Any, broker: Any) -> list[tuple[str, str]]:
    import celery
    import gunicorn
    import kombu
    import redis

    return [
        ("celery", f"{celery.__version__} (kombu {kombu.__version__}), broker Redis {broker.info()['redis_version']}"),
        ("gunicorn", gunicorn.__version__),
        ("redis-py", redis.__version__),
    ]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server = args.server.rstrip("/")
    database_url = f"{server}/{DATABASE}"
    # Forced, not defaulted: this script creates and drops the database and flushes the Redis
    # database it points Django, the worker and the web server at.
    env = {
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": args.broker,
        "SIGNAL_BATCH_SIZE": "500",
        "DEBUG": "false",  # production's; dev's default DEBUG=True logs every query
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    child_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")])),
    }

    import django
    import psycopg
    import redis

    broker = redis.Redis.from_url(args.broker)
    broker.flushdb()
    admin_url = f"{server}/postgres"
    run_sql(admin_url, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    run_sql(admin_url, f"CREATE DATABASE {DATABASE}")
    load_before = os.getloadavg()
    children = None
    try:
        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from bench import pipeline_data, report
        from bench.pipeline_phases import Options, PipelineBench, progress
        from bench.processes import Children

        call_command("migrate", verbosity=0)
        children = Children()
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
            lookup_rounds=7 if args.quick else 31,
            ingest_seconds=args.ingest_seconds,
            ingest_warmup=2.0 if args.quick else 3.0,
            ingest_clients=args.ingest_clients,
            ingest_workers=args.ingest_workers,
            seed=args.seed,
            extras=not args.no_extras,
        )
        with psycopg.connect(database_url, autocommit=True, options="-c TimeZone=UTC") as conn:
            facts = [fact for fact in machine(conn) if fact[0] not in ("settings", "LEAVE_CACHE_REWARM_AFTER")]
            facts += versions(conn, broker)
            progress(f"making {shape.users:,} users' memberships, leaves, {shape.signals:,} signals")
            sender = get_user_model().objects.create_user(username="bench-sender")
            data = pipeline_data.create(conn, shape, sender.pk)
            bench = PipelineBench(conn, data, options, child_env, broker, children)
            bench.run()
    finally:
        if children is not None:
            children.stop_all()
        from django.apps import apps

        if apps.ready:
            from django.db import connections

            connections.close_all()
        run_sql(admin_url, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
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
        ("settings", f"{SETTINGS}, DEBUG=False, SIGNAL_BATCH_SIZE=500, LOG_LEVEL=WARNING"),
        ("broker", f"{redact(args.broker)} (flushed before and after)"),
        (
            "data",
            f"{shape.users:,} users in {shape.communities} communities ({data.community_memberships / shape.users:.2f} "
            f"each on average) and {shape.cohorts} cohorts ({data.cohort_memberships / shape.users:.2f}), "
            f"{len(data.left):,} left ({shape.left_share:.0%}); {shape.signals:,} signals on {shape.items:,} items "
            f"(Zipf), {len(pipeline_data.KINDS)} kinds, over {shape.hours} hours",
        ),
    ]
    command = command_line(argv)
    print()
    print(report.text_table("BUDGETS", bench.budgets))
    print()
    print(report.text_table("FOR INFORMATION", bench.info))
    print()
    print("PROFILE of signals_process (cProfile of further batches, in this process)")
    print(bench.profile_text)
    for what in bench.failed_checks:
        print(f"CHECK FAILED: {what}")
    passed = all(row.passed for row in bench.budgets) and not bench.failed_checks
    print(f"\n{'PASS' if passed else 'FAIL'}: {command}")
    if not args.no_write:
        section = markdown_section(command, facts, bench, passed)
        report.write_section(args.output, section, start=START, end=END)
        print(f"results written to {args.output}")
    return 0 if passed else 1


def redact(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"


# The text of the section above its results: what is measured, how, and the method notes.
DESCRIPTION = Path(__file__).with_name("pipeline.md")


def markdown_section(command: str, facts: list[tuple[str, str]], bench: Any, passed: bool) -> str:
    from bench import report

    fact_lines = "\n".join(f"| {key} | {value} |" for key, value in facts)
    checks = (
        "\n".join(f"- FAILED: {what}" for what in bench.failed_checks)
        if bench.failed_checks
        else "All correctness checks passed (the floor's aggregates and outcomes equal the expected ones, the "
        "worker's equal the floor's, nothing left pending or queued, every ingest request accepted and stored)."
    )
    return f"""{DESCRIPTION.read_text().strip()}

### Results of the last run: {"PASS" if passed else "FAIL"}

```
{command}
```

| Item | Value |
|---|---|
{fact_lines}

#### Budgets

{report.markdown_table(bench.budgets)}

#### For information

{report.markdown_table(bench.info)}

#### Profile of signals_process (cProfile of further batches, in the benchmark's process)

```
{bench.profile_text}
```

#### Checks

{checks}
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
