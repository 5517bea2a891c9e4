"""The operators' pages and the read endpoints on big tables: p95 over HTTP, and their plans.

    python bench/pages.py            # 10,000,000 signals, 1,000,000 records, 5,000,000 history rows
    python bench/pages.py --quick    # 200,000 / 50,000 / 100,000: a smoke run

What it does, and what fails it, is bench/pages.md (the text above its section of BENCHMARKS.md).
"""

from __future__ import annotations

import os
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import progress
from bench.pages_requests import PAGES, Context, explain_pages, measure, session_log_in
from support.processes import Children

DATABASE = "tidal_bench_pages"
START, END = "<!-- pages:start -->", "<!-- pages:end -->"
BUDGET_MS = 300.0
DESCRIPTION = Path(__file__).with_name("pages.md")
SIZES = {
    "signals": (200_000, 10_000_000),
    "records": (50_000, 1_000_000),
    "history": (100_000, 5_000_000),
    "requests": (10, 40),
}


def parse_args(argv: list[str]) -> Any:
    parser = common.arguments(__doc__, quick="small tables and fewer requests: a smoke run")
    add = parser.add_argument
    add("--signals", type=int, help="signals (default 10,000,000; 200,000 quick)")
    add("--records", type=int, help="leave records (default 1,000,000; 50,000 quick)")
    add("--history", type=int, help="history rows (default 5,000,000; 100,000 quick)")
    add("--requests", type=int, help="requests per page (default 40; 10 quick)")
    add("--workers", type=int, help="gunicorn workers (default: deploy/gunicorn.conf.py's)")
    add(
        "--reuse",
        action="store_true",
        help="keep the database between runs: fill it only when it is new (migrations still run); "
        "for working on the pages, not for the reported figures",
    )
    add("--only", help="only the pages whose name contains this text (while working on them)")
    add("--load-only", action="store_true", help="with --reuse: fill the database and stop")
    args = common.parse(parser, argv, SIZES)
    if args.load_only and not args.reuse:
        parser.error("--load-only needs --reuse (the database is dropped otherwise)")
    if args.records < 1_000 or args.signals < 10_000 or args.history < args.records:
        parser.error("at least 1,000 records, 10,000 signals, and as many history rows as records")
    return args


# --- the run ------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    fresh = not (args.reuse and common.database_exists(args.server, DATABASE))
    env = {"DEBUG": "false", "LOG_LEVEL": "WARNING", "THROTTLE_LOGIN_RATE": "1000/minute"}
    with common.database(DATABASE, args.server, env, keep=args.reuse) as url, Children() as children:
        import psycopg
        import requests
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission

        from accounts.services import token_issue
        from bench import pages_data, report

        now = datetime.now(UTC)
        sizes = pages_data.Sizes(
            signals=args.signals,
            records=args.records,
            history=args.history,
            communities=200,
            cohorts=50,
            community_rows_per_hour=2 if args.quick else 35,
            cohort_rows_per_hour=3 if args.quick else 40,
        )
        users = get_user_model().objects
        password = "bench-pages-password"
        operator = users.filter(username="bench-operator").first() or users.create_superuser(
            "bench-operator", password=password
        )
        service = users.filter(username="bench-service").first() or users.create_user("bench-service")
        service.user_permissions.add(
            *Permission.objects.filter(codename__in=["view_communityleave", "view_signal", "view_cohort", "add_signal"])
        )
        token = token_issue(user=service)[1]
        with psycopg.connect(url, autocommit=True) as conn:
            facts = common.machine(conn)
            if fresh:
                loaded = pages_data.fill(conn, sizes, sender_id=service.pk, now=now, progress=progress)
                load_seconds = loaded.seconds
            else:
                progress("data: reusing the database (--reuse); ANALYZE")
                conn.execute("ANALYZE")
                load_seconds = {}
                first = conn.execute(f"SELECT min(received_at) FROM {pages_data.SIGNAL_TABLE}").fetchone()[0]
                now = first + timedelta(days=sizes.signal_days)
            rows = {
                table: conn.execute(
                    "SELECT reltuples::bigint, pg_total_relation_size(%s::regclass) FROM pg_class WHERE relname = %s",
                    [table, table],
                ).fetchone()
                for table in pages_data.BIG_TABLES
            }
            signal_indexes = conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes "
                "WHERE relname = %s ORDER BY indexrelname",
                [pages_data.SIGNAL_TABLE],
            ).fetchall()
        if args.load_only:
            progress("loaded (--load-only)")
            return 0
        ctx = Context(sizes.users, sizes.heavy_users, args.signals, args.history, sizes.communities, sizes.cohorts, now)
        gunicorn, base = common.gunicorn(children, common.child_env(), args.workers)
        api = requests.Session()
        api.headers["Authorization"] = f"Token {token}"
        clients = {"session": session_log_in(base, "bench-operator", password), "token": api}
        if args.only:
            PAGES[:] = [page for page in PAGES if args.only in page.name]
        progress(f"requests: {len(PAGES)} pages x {args.requests}, one at a time, gunicorn at {base}")
        measured = measure(base, clients, ctx, args.requests, args.seed)
        children.stop(gunicorn)

        progress("plans: each page through the test client, every statement EXPLAINed")
        plans = explain_pages(ctx, operator, token, pages_data.BIG_TABLES)

    workers = args.workers or 2 * len(os.sched_getaffinity(0)) + 1
    facts += [
        (
            "tables",
            ", ".join(f"{table} {count:,} rows ({size / 2**30:.2f} GiB)" for table, (count, size) in rows.items()),
        ),
        (
            "data",
            f"signals over {sizes.signal_days} days ({sizes.users:,} users, 1% from {sizes.heavy_users} heavy users; "
            f"the newest 0.05% pending, 0.01% failed, 10% gated, 15% no target, the rest attributed), "
            f"records of every even user id (10% active, 0.01% corrupt), {args.history // args.records} history "
            f"rows a record over {sizes.history_days} days, {sizes.communities} communities and {sizes.cohorts} "
            f"cohorts with {sizes.community_rows_per_hour} and {sizes.cohort_rows_per_hour} aggregate rows an hour "
            f"each over {sizes.aggregate_hours} hours",
        ),
        ("load", ", ".join(f"{name} {seconds:,.1f} s" for name, seconds in load_seconds.items()) or "reused"),
        ("signal indexes", ", ".join(f"{name} {size / 2**20:,.0f} MiB" for name, size in signal_indexes)),
        ("server", f"gunicorn, deploy/gunicorn.conf.py, {workers} sync workers, one request at a time"),
        ("requests", f"{args.requests} a page (after 2 untimed rounds), ids, slugs and filters varied"),
    ]
    failed: list[str] = []
    rows_out: list[Any] = []
    for result in measured:
        name = result.page.name
        p95 = result.percentile(0.95) * 1e3
        plan = plans[name]
        ok = p95 < BUDGET_MS and not result.errors and not plan.seq_scans and plan.statuses == {200}
        if result.errors:
            failed.append(f"{name}: answers other than 200: {'; '.join(result.errors[:3])}")
        if plan.statuses != {200}:
            failed.append(f"{name}: the test client got {sorted(plan.statuses)}")
        failed.extend(f"{name}: Seq Scan on {scan}" for scan in plan.seq_scans[:3])
        rows_out.append(
            report.Row(
                name,
                f"p50 {statistics.median(result.seconds) * 1e3:,.1f} ms, p95 {p95:,.1f} ms",
                f"{plan.queries} queries; " + (", ".join(sorted(plan.index_scans)) or "no big table"),
                "",
                f"p95 < {BUDGET_MS:g} ms, no Seq Scan on a big table",
                ok,
            )
        )
    passed = all(row.passed for row in rows_out) and not failed
    command = common.command_line("pages.py", argv)
    checks = common.checks_text(
        failed,
        "Every page answered 200 to every request, and no statement any page issued scans a big table "
        "sequentially (the plans column names the index each one reads).",
    )
    table = report.markdown_table(rows_out).replace("| Floor |", "| Queries a request; scans of the big tables |")
    section = lambda: common.results_section(  # noqa: E731
        command, facts, [("", table), ("Checks", checks)], passed, description=DESCRIPTION, level=3
    )
    printed = [report.text_table("PAGES", rows_out)]
    return common.conclude(args, command, printed, failed, passed, section, (START, END), failed_prefix="FAILED")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
