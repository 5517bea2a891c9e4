"""Measure the leave cache's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/run.py                   # 1,000,000 records, writes BENCHMARKS.md
    python bench/run.py --quick           # 100,000 records, fewer rounds
    python bench/run.py --records 20000   # any size

Creates its own PostgreSQL database (tidal_bench), migrates it, and drops it at the end,
also on error or Ctrl-C. Django runs with tidalproject.settings.dev, DEBUG off unless the
environment sets it. Exits 1 when a budget is missed or a correctness check fails.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
DATABASE = "tidal_bench"
SETTINGS = "tidalproject.settings.dev"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--records",
        type=int,
        help="records to warm from (default 1,000,000; 100,000 with --quick); below 50,000 a "
        "Python set's growth step alone can exceed the 100 B/record budget",
    )
    parser.add_argument("--quick", action="store_true", help="100,000 records and fewer rounds, for a quick try")
    parser.add_argument("--server", default="postgres://127.0.0.1:5432", help="PostgreSQL server URL, no database")
    parser.add_argument("--output", type=Path, default=PROJECT_DIR / "BENCHMARKS.md", help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument("--seed", type=int, default=20_240_101)
    parser.add_argument(
        "--scale", type=int, default=None, help="gated users of the warm at scale (default 10,000,000; 0: skip)"
    )
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = 100_000 if args.quick else 1_000_000
    if args.records < 1_000:
        parser.error("--records must be at least 1,000")
    return args


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # so that the finally clause drops the database


def run_sql(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def command_line(argv: list[str]) -> str:
    python = Path(sys.executable)
    shown = python.relative_to(PROJECT_DIR) if python.is_relative_to(PROJECT_DIR) else python
    return shlex.join([str(shown), "bench/run.py", *argv])  # run from the project folder


def machine(conn: Any) -> list[tuple[str, str]]:
    import django
    import psycopg
    from django.conf import settings

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?")
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kib = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal:")), 0)
    server_version = conn.execute("SHOW server_version").fetchone()[0]
    shared_buffers = conn.execute("SHOW shared_buffers").fetchone()[0]
    libpq = psycopg.pq.version()
    return [
        ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("nproc", f"{len(os.sched_getaffinity(0))} ({cpu})"),
        ("memory", f"{mem_kib / 2**20:.1f} GiB"),
        ("os", platform.platform()),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("django", django.get_version()),
        ("psycopg", f"{psycopg.__version__} ({psycopg.pq.__impl__}, libpq {libpq // 10000}.{libpq % 10000})"),
        ("postgresql", f"{server_version} at {conn.info.host}:{conn.info.port}, shared_buffers {shared_buffers}"),
        ("settings", f"{os.environ['DJANGO_SETTINGS_MODULE']}, DEBUG={settings.DEBUG}"),
        ("LEAVE_CACHE_REWARM_AFTER", f"{settings.LEAVE_CACHE_REWARM_AFTER:,}"),
    ]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server = args.server.rstrip("/")
    database_url = f"{server}/{DATABASE}"
    # Forced, not defaulted: this script creates and drops the database it points Django at.
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ["DATABASE_URL"] = database_url
    # Production runs with DEBUG off; dev's default DEBUG=True adds Django's query log to each query.
    os.environ.setdefault("DEBUG", "false")
    # The cache logs each warm at INFO: keep the timed runs quiet.
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    sys.path.insert(0, str(PROJECT_DIR))

    import django
    import psycopg

    admin_url = f"{server}/postgres"
    run_sql(admin_url, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    run_sql(admin_url, f"CREATE DATABASE {DATABASE}")
    try:
        django.setup()
        from django.core.management import call_command

        from bench import report, tools
        from bench.phases import Bench, Options

        call_command("migrate", verbosity=0)
        options = Options(
            records=args.records,
            active_share=0.10,
            warm_rounds=3 if args.quick else 7,
            lookup_rounds=10 if args.quick else 31,
            probes=200_000,
            fence_rounds=3 if args.quick else 7,
            fence_calls=300 if args.quick else 1_000,
            sync_steps=(1, 100, 10_000),
            sync_rounds=1 if args.quick else 3,
            seed=args.seed,
            scale_records=args.scale if args.scale is not None else (0 if args.quick else 10_000_000),
        )
        with psycopg.connect(database_url, autocommit=True) as conn:
            facts = machine(conn)
            bench = Bench(conn, options)
            bench.run()
    finally:
        from django.apps import apps

        if apps.ready:
            from django.db import connections

            connections.close_all()
        run_sql(admin_url, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")

    facts += [
        (
            "records",
            f"{options.records:,} ({options.active_share:.0%} ACTIVE), "
            f"ids drawn from 1..{tools.ID_SPACE * options.records:,}",
        ),
        ("probes", f"{options.probes:,}, half with a record, half without"),
        ("rounds", f"warm {options.warm_rounds}, look-ups {options.lookup_rounds}, fence {options.fence_rounds}"),
    ]
    command = command_line(argv)
    print()
    print(report.text_table("BUDGETS", bench.budgets))
    print()
    print(report.text_table("FOR INFORMATION", bench.info))
    for what in bench.failed_checks:
        print(f"CHECK FAILED: {what}")
    passed = all(row.passed for row in bench.budgets) and not bench.failed_checks
    print(f"\n{'PASS' if passed else 'FAIL'}: {command}")
    if not args.no_write:
        section = report.markdown_section(
            command=command,
            facts=facts,
            budgets=bench.budgets,
            info=bench.info,
            failed_checks=bench.failed_checks,
            passed=passed,
        )
        report.write_section(args.output, section)
        print(f"results written to {args.output}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
