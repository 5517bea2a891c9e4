"""The operators' pages and the read endpoints on big tables: p95 over HTTP, and their plans.

    python bench/pages.py            # 10,000,000 signals, 1,000,000 records, 5,000,000 history rows
    python bench/pages.py --quick    # 200,000 / 50,000 / 100,000: a smoke run

Creates its own PostgreSQL database (tidal_bench_pages), migrates it, fills it in SQL
(bench/pages_data.py), VACUUM ANALYZEs it, starts gunicorn from deploy/gunicorn.conf.py on a
free loopback port, logs an operator in (the admin's log-in form: a session) and issues an
API token to a service account, then requests every page and endpoint ``--requests`` times,
one request at a time, with varied ids, slugs and filters; then, in this process, runs each
page again through Django's test client and EXPLAINs every query it issued. Rewrites the
section between the ``pages`` markers of BENCHMARKS.md; exits 1 when a p95 is at or above
300 ms, a page answers other than 200, or a query scans a big table sequentially. Drops the
database and stops gunicorn at the end, also on error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.common import progress
from support.processes import Children

DATABASE = "tidal_bench_pages"
START, END = "<!-- pages:start -->", "<!-- pages:end -->"
BUDGET_MS = 300.0
DESCRIPTION = Path(__file__).with_name("pages.md")
CONSOLE = "/admin/community/communityleave/console"
EXPLAINED_PER_PAGE = 8
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


# --- what is requested --------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What the samplers draw from."""

    users: int  # signals' users are 1..users; even ids have a record and history
    heavy_users: int
    signals: int
    history: int
    communities: int
    cohorts: int
    now: datetime


Sampler = Callable[[int, random.Random, Context], str]


@dataclass(frozen=True)
class Page:
    name: str
    auth: str  # "session" (the admin) or "token" (the API)
    sample: Sampler


@dataclass
class Measured:
    page: Page
    seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def percentile(self, share: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def _cycle(i: int, choices: list[Any]) -> Any:
    return choices[i % len(choices)]


def _user(i: int, rng: random.Random, ctx: Context) -> int:
    """A user with a record and history; every fourth one a heavy user (a long signal list)."""
    if i % 4 == 3:
        return 2 * rng.randint(1, ctx.heavy_users)
    return 2 * rng.randint(1, ctx.users // 2)


def _since(ctx: Context, hours: int) -> str:
    return (ctx.now - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:00:00Z")


KINDS = ["view", "like", "share", "comment", "save", "click", "follow", "report"]
SIGNALS = "/admin/signals_app/signal/"
RECORDS = "/admin/community/communityleave/"
HISTORY = "/admin/community/leavehistory/"
COMMUNITY_AGGREGATES = "/admin/signals_app/communityaggregate/"
COHORT_AGGREGATES = "/admin/signals_app/cohortaggregate/"

PAGES = [
    Page("admin: signals", "session", lambda i, r, c: SIGNALS),
    Page("admin: signals, page 2 to 9", "session", lambda i, r, c: f"{SIGNALS}?p={2 + i % 8}"),
    Page(
        "admin: signals by outcome", "session", lambda i, r, c: f"{SIGNALS}?outcome__exact={_cycle(i, [2, 4, 0, 3, 1])}"
    ),
    Page(
        "admin: signals by gated reason",
        "session",
        lambda i, r, c: f"{SIGNALS}?gated_reason__exact={_cycle(i, [4, 1, 2, 3])}",
    ),
    Page("admin: signals by kind", "session", lambda i, r, c: f"{SIGNALS}?kind={_cycle(i, KINDS[::-1])}"),
    Page(
        "admin: signals received in the last …",
        "session",
        lambda i, r, c: f"{SIGNALS}?received={_cycle(i, ['1h', '24h', '7d', '30d'])}",
    ),
    Page(
        "admin: signals by outcome and kind",
        "session",
        lambda i, r, c: f"{SIGNALS}?outcome__exact={_cycle(i, [2, 3])}&kind={_cycle(i, ['report', 'view', 'like'])}",
    ),
    Page("admin: signals, search by user id", "session", lambda i, r, c: f"{SIGNALS}?q={_user(i, r, c)}"),
    Page("admin: a signal", "session", lambda i, r, c: f"{SIGNALS}{r.randint(1, c.signals)}/change/"),
    Page("admin: leave records", "session", lambda i, r, c: RECORDS),
    Page(
        "admin: leave records by status",
        "session",
        lambda i, r, c: f"{RECORDS}?status={_cycle(i, ['corrupt', 'active', 'left'])}",
    ),
    Page("admin: leave records, search by user id", "session", lambda i, r, c: f"{RECORDS}?q={_user(i, r, c)}"),
    Page("admin: a leave record", "session", lambda i, r, c: f"{RECORDS}{_user(i, r, c)}/change/"),
    Page("admin: history", "session", lambda i, r, c: HISTORY),
    Page("admin: a history entry", "session", lambda i, r, c: f"{HISTORY}{r.randint(1, c.history)}/change/"),
    Page(
        "admin: history by action or source",
        "session",
        lambda i, r, c: (
            HISTORY
            + _cycle(
                i, ["?source__exact=command", "?action__exact=rejoin", "?source__exact=admin", "?action__exact=leave"]
            )
        ),
    ),
    Page(
        "admin: history changed in the last …",
        "session",
        lambda i, r, c: f"{HISTORY}?changed={_cycle(i, ['1h', '24h', '7d', '30d'])}",
    ),
    Page("admin: history, search by user id", "session", lambda i, r, c: f"{HISTORY}?q={_user(i, r, c)}"),
    Page("admin: community aggregates", "session", lambda i, r, c: COMMUNITY_AGGREGATES),
    Page(
        "admin: community aggregates by community",
        "session",
        lambda i, r, c: f"{COMMUNITY_AGGREGATES}?community__id__exact={r.randint(1, c.communities)}",
    ),
    Page(
        "admin: community aggregates by kind",
        "session",
        lambda i, r, c: f"{COMMUNITY_AGGREGATES}?kind={_cycle(i, KINDS[::-1])}",
    ),
    Page("admin: cohort aggregates", "session", lambda i, r, c: COHORT_AGGREGATES),
    Page(
        "admin: cohort aggregates by cohort",
        "session",
        lambda i, r, c: f"{COHORT_AGGREGATES}?cohort__id__exact={r.randint(1, c.cohorts)}",
    ),
    Page("console: dashboard", "session", lambda i, r, c: f"{CONSOLE}/"),
    Page("console: a user's page", "session", lambda i, r, c: f"{CONSOLE}/user/{_user(i, r, c)}/"),
    Page("console: bulk leave form", "session", lambda i, r, c: f"{CONSOLE}/bulk-leave/"),
    Page("API: status", "token", lambda i, r, c: f"/api/community-layer/{_user(i, r, c)}/"),
    Page("API: a user's history", "token", lambda i, r, c: f"/api/community-layer/{_user(i, r, c)}/history/"),
    Page("API: a user's signals", "token", lambda i, r, c: f"/api/community-layer/{_user(i, r, c)}/signals/"),
    Page(
        "API: trending (default window)",
        "token",
        lambda i, r, c: f"/api/communities/c{r.randint(1, c.communities)}/trending/",
    ),
    Page(
        "API: trending, a kind, the last 7 days",
        "token",
        lambda i, r, c: (
            f"/api/communities/c{r.randint(1, c.communities)}/trending/"
            f"?kind={_cycle(i, KINDS)}&since={_since(c, 7 * 24)}&limit=50"
        ),
    ),
    Page(
        "API: attribution (default window)",
        "token",
        lambda i, r, c: f"/api/cohorts/k{r.randint(1, c.cohorts)}/attribution/",
    ),
    Page(
        "API: attribution, the last 7 days",
        "token",
        lambda i, r, c: f"/api/cohorts/k{r.randint(1, c.cohorts)}/attribution/?since={_since(c, 7 * 24)}",
    ),
]


# --- over HTTP ----------------------------------------------------------------------------


def session_log_in(base: str, username: str, password: str) -> Any:
    """The admin's log-in form, as a browser submits it: a session cookie."""
    import requests

    session = requests.Session()
    page = session.get(f"{base}/admin/login/", timeout=30)
    page.raise_for_status()
    token = session.cookies["csrftoken"]
    answer = session.post(
        f"{base}/admin/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token, "next": "/admin/"},
        headers={"Referer": f"{base}/admin/login/"},
        timeout=30,
        allow_redirects=False,
    )
    if answer.status_code != 302 or "sessionid" not in session.cookies:
        raise RuntimeError(f"admin log-in failed: {answer.status_code} {answer.text[:300]}")
    return session


def measure(base: str, clients: dict[str, Any], ctx: Context, rounds: int, seed: int) -> list[Measured]:
    """Every page once a round, in order, one request at a time; rounds alternate the pages so
    that drift hits all alike. Two untimed rounds first (each worker warms up)."""
    rng = random.Random(seed)
    results = [Measured(page) for page in PAGES]
    for warm in range(2):
        for page in PAGES:
            clients[page.auth].get(base + page.sample(warm + 1000, rng, ctx), timeout=60)
    for i in range(rounds):
        for result in results:
            path = result.page.sample(i, rng, ctx)
            started = time.perf_counter()
            answer = clients[result.page.auth].get(base + path, timeout=60, allow_redirects=False)
            elapsed = time.perf_counter() - started
            if answer.status_code != 200:
                result.errors.append(f"{path}: {answer.status_code}")
            result.seconds.append(elapsed)
        if (i + 1) % 10 == 0:
            progress(f"requests: round {i + 1} of {rounds}")
    return results


# --- the plans ----------------------------------------------------------------------------


@dataclass
class Plans:
    queries: int = 0
    index_scans: set[str] = field(default_factory=set)  # "table: index" on big tables
    seq_scans: list[str] = field(default_factory=list)  # "table: the statement" on big tables
    other_seq: set[str] = field(default_factory=set)  # small tables (the planner's choice; harmless)
    statuses: set[int] = field(default_factory=set)


def _walk(node: dict[str, Any], relation: str | None = None) -> Any:
    """Every node with the table it reads (a bitmap index scan's is its bitmap heap scan's)."""
    relation = node.get("Relation Name", relation)
    yield node, relation
    for child in node.get("Plans", []):
        yield from _walk(child, relation)


def explain_pages(ctx: Context, admin_user: Any, token: str, big_tables: tuple[str, ...]) -> dict[str, Plans]:
    """Each page through Django's test client in this process (the same code as gunicorn
    runs); every statement it issued EXPLAINed afterwards with the same parameters."""
    from django.db import connection
    from django.test import Client

    session = Client(HTTP_HOST="127.0.0.1")
    session.force_login(admin_user)
    api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {token}")
    clients = {"session": session, "token": api}
    rng = random.Random(7)
    found: dict[str, Plans] = {}
    for page in PAGES:
        plans = found.setdefault(page.name, Plans())
        for i in range(EXPLAINED_PER_PAGE):
            issued: list[tuple[str, Any]] = []

            def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
                issued.append((sql, params))  # noqa: B023 - used within this iteration only
                return execute(sql, params, many, context)

            path = page.sample(i, rng, ctx)
            with connection.execute_wrapper(capture):
                plans.statuses.add(clients[page.auth].get(path).status_code)
            plans.queries += len(issued)
            with connection.cursor() as cursor:
                for sql, params in issued:
                    if not sql.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE")):
                        continue
                    cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                    plan = cursor.fetchone()[0]
                    if isinstance(plan, str):
                        import json

                        plan = json.loads(plan)
                    for node, relation in _walk(plan[0]["Plan"]):
                        if node["Node Type"] == "Seq Scan":
                            if relation in big_tables:
                                plans.seq_scans.append(f"{relation} ({path}): {' '.join(sql.split())[:300]}")
                            elif relation:
                                plans.other_seq.add(relation)
                        elif "Index Name" in node and relation in big_tables:
                            plans.index_scans.add(f"{node['Node Type']} {node['Index Name']}")
        plans.queries //= EXPLAINED_PER_PAGE
    return found


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
