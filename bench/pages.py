"""The operators' pages and the read endpoints on big tables: p95 over HTTP, and their plans.
What it does, and what fails it: bench/pages.md (the text above its section of BENCHMARKS.md)."""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, report
from bench.common import progress
from bench.pages_data import BIG_TABLES, COHORTS, COMMUNITIES, HEAVY_USERS, KINDS
from support.processes import Children

DATABASE = "tidal_bench_pages"
START, END = "<!-- pages:start -->", "<!-- pages:end -->"
BUDGET_MS = 300.0
EXPLAINED_PER_PAGE = 8
PASSWORD = "bench-pages-password"
SIZES = {
    "signals": (200_000, 10_000_000),
    "records": (50_000, 1_000_000),
    "history": (100_000, 5_000_000),
    "requests": (10, 40),
}


def page(name: str, path: str, **turns: Any) -> tuple[str, str, dict[str, Any]]:
    """An "API: " page is asked with the token, the others with the operator's session. Each
    request fills a field of ``turns`` with its turn of the values, the others as ``fill_path`` draws."""
    return name, path, turns


SIGNALS = "/admin/signals_app/signal/"
RECORDS = "/admin/community/communityleave/"
HISTORY = "/admin/community/leavehistory/"
COMMUNITY_AGGREGATES = "/admin/signals_app/communityaggregate/"
COHORT_AGGREGATES = "/admin/signals_app/cohortaggregate/"
CONSOLE = "/admin/community/communityleave/console/"
TRENDING = "/api/communities/c{community}/trending/"
ATTRIBUTION = "/api/cohorts/k{cohort}/attribution/"
LAST = ["1h", "24h", "7d", "30d"]

PAGES = [
    page("admin: signals", SIGNALS),
    page("admin: signals, page 2 to 9", SIGNALS + "?p={p}", p=range(2, 10)),
    page("admin: signals by outcome", SIGNALS + "?outcome__exact={o}", o=[2, 4, 0, 3, 1]),
    page("admin: signals by gated reason", SIGNALS + "?gated_reason__exact={r}", r=[4, 1, 2, 3]),
    page("admin: signals by kind", SIGNALS + "?kind={kind}", kind=KINDS[::-1]),
    page("admin: signals received in the last …", SIGNALS + "?received={last}", last=LAST),
    page(
        "admin: signals by outcome and kind",
        SIGNALS + "?outcome__exact={o}&kind={kind}",
        o=[2, 3],
        kind=["report", "view", "like"],
    ),
    page("admin: signals, search by user id", SIGNALS + "?q={user}"),
    page("admin: a signal", SIGNALS + "{signal}/change/"),
    page("admin: leave records", RECORDS),
    page("admin: leave records by status", RECORDS + "?status={s}", s=["corrupt", "active", "left"]),
    page("admin: leave records, search by user id", RECORDS + "?q={user}"),
    page("admin: a leave record", RECORDS + "{user}/change/"),
    page("admin: history", HISTORY),
    page("admin: a history entry", HISTORY + "{entry}/change/"),
    page(
        "admin: history by action or source",
        HISTORY + "?{f}",
        f=["source__exact=command", "action__exact=rejoin", "source__exact=admin", "action__exact=leave"],
    ),
    page("admin: history changed in the last …", HISTORY + "?changed={last}", last=LAST),
    page("admin: history, search by user id", HISTORY + "?q={user}"),
    page("admin: community aggregates", COMMUNITY_AGGREGATES),
    page("admin: community aggregates by community", COMMUNITY_AGGREGATES + "?community__id__exact={community}"),
    page("admin: community aggregates by kind", COMMUNITY_AGGREGATES + "?kind={kind}", kind=KINDS[::-1]),
    page("admin: cohort aggregates", COHORT_AGGREGATES),
    page("admin: cohort aggregates by cohort", COHORT_AGGREGATES + "?cohort__id__exact={cohort}"),
    page("console: dashboard", CONSOLE),
    page("console: a user's page", CONSOLE + "user/{user}/"),
    page("console: bulk leave form", CONSOLE + "bulk-leave/"),
    page("API: status", "/api/community-layer/{user}/"),
    page("API: a user's history", "/api/community-layer/{user}/history/"),
    page("API: a user's signals", "/api/community-layer/{user}/signals/"),
    page("API: trending (default window)", TRENDING),
    page("API: trending, a kind, the last 7 days", TRENDING + "?kind={kind}&since={since}&limit=50", kind=KINDS),
    page("API: attribution (default window)", ATTRIBUTION),
    page("API: attribution, the last 7 days", ATTRIBUTION + "?since={since}"),
]


def fill_path(path: str, turns: dict[str, Any], i: int, rng: random.Random, args: Any, now: datetime) -> str:
    values = {key: choices[i % len(choices)] for key, choices in turns.items()}
    draws = {
        # A user with a record and history; every fourth one a heavy user (a long signal list).
        "user": lambda: 2 * rng.randint(1, HEAVY_USERS if i % 4 == 3 else args.records),
        "signal": lambda: rng.randint(1, args.signals),
        "entry": lambda: rng.randint(1, args.history),
        "community": lambda: rng.randint(1, COMMUNITIES),
        "cohort": lambda: rng.randint(1, COHORTS),
        "since": lambda: (now - timedelta(days=7)).strftime("%Y-%m-%dT%H:00:00Z"),
    }
    drawn = {key: draw() for key, draw in draws.items() if "{" + key + "}" in path and key not in values}
    return path.format(**values, **drawn)


def session_log_in(base: str) -> Any:
    """The admin's log-in form, as a browser submits it: a session cookie."""
    import requests

    session = requests.Session()
    session.get(f"{base}/admin/login/", timeout=30).raise_for_status()
    answer = session.post(
        f"{base}/admin/login/",
        data={"username": "bench-operator", "password": PASSWORD, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        headers={"Referer": f"{base}/admin/login/"},
        timeout=30,
        allow_redirects=False,
    )
    if answer.status_code != 302 or "sessionid" not in session.cookies:
        raise RuntimeError(f"admin log-in failed: {answer.status_code} {answer.text[:300]}")
    return session


def measure(base: str, session: Any, api: Any, results: dict[str, Any], args: Any, now: datetime) -> None:
    """Every page once a round, in order, one request at a time, so that drift hits all pages
    alike. Two untimed rounds first (each worker warms up)."""
    rng = random.Random(args.seed)
    for i in range(-2, args.requests):
        for name, path, turns in PAGES:
            url = fill_path(path, turns, i, rng, args, now)
            started = time.perf_counter()
            answer = (api if name.startswith("API") else session).get(base + url, timeout=60, allow_redirects=False)
            elapsed = time.perf_counter() - started
            if i >= 0:
                results[name]["seconds"].append(elapsed)
                if answer.status_code != 200:
                    results[name]["errors"].append(f"{url}: {answer.status_code}")
        if i >= 0 and (i + 1) % 10 == 0:
            progress(f"requests: round {i + 1} of {args.requests}")


def walk(node: dict[str, Any], relation: str | None = None) -> Any:
    """Every node with the table it reads (a bitmap index scan's is its bitmap heap scan's)."""
    relation = node.get("Relation Name", relation)
    yield node, relation
    for child in node.get("Plans", []):
        yield from walk(child, relation)


def explain(operator: Any, token: str, results: dict[str, Any], args: Any, now: datetime) -> None:
    """Each page through Django's test client in this process (the same code as gunicorn runs);
    every statement it issued EXPLAINed afterwards with the same parameters."""
    from django.db import connection
    from django.test import Client

    session = Client(HTTP_HOST="127.0.0.1")
    session.force_login(operator)
    api = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {token}")
    rng = random.Random(7)
    issued: list[tuple[str, Any]] = []  # the statements of the request being made

    def capture(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        issued.append((sql, params))
        return execute(sql, params, many, context)

    for name, path, turns in PAGES:
        result = results[name]
        for i in range(EXPLAINED_PER_PAGE):
            issued.clear()
            url = fill_path(path, turns, i, rng, args, now)
            with connection.execute_wrapper(capture):
                result["statuses"].add((api if name.startswith("API") else session).get(url).status_code)
            result["queries"] += len(issued)
            with connection.cursor() as cursor:
                for sql, params in issued:
                    if not sql.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE")):
                        continue
                    cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
                    for node, relation in walk(cursor.fetchone()[0][0]["Plan"]):
                        if relation not in BIG_TABLES:
                            continue  # a small table's Seq Scan is the planner's choice, and harmless
                        if node["Node Type"] == "Seq Scan":
                            result["seq_scans"].append(f"{relation} ({url}): {' '.join(sql.split())[:300]}")
                        elif "Index Name" in node:
                            result["index_scans"].add(f"{node['Node Type']} {node['Index Name']}")
        result["queries"] //= EXPLAINED_PER_PAGE


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="small tables and fewer requests: a smoke run")
    parser.add_argument("--signals", type=int, help="signals (default 10,000,000; 200,000 quick)")
    parser.add_argument("--records", type=int, help="leave records (default 1,000,000; 50,000 quick)")
    parser.add_argument("--history", type=int, help="history rows (default 5,000,000; 100,000 quick)")
    parser.add_argument("--requests", type=int, help="requests per page (default 40; 10 quick)")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: deploy/gunicorn.conf.py's)")
    args = common.parse(parser, argv, SIZES)
    if args.records < 1_000 or args.signals < 10_000 or args.history < args.records:
        parser.error("at least 1,000 records, 10,000 signals, and as many history rows as records")
    env = {"DEBUG": "false", "LOG_LEVEL": "WARNING", "THROTTLE_LOGIN_RATE": "1000/minute"}
    with common.database(DATABASE, args.server, env) as url, Children() as children:
        import psycopg
        import requests
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Permission

        from accounts.services import token_issue
        from bench import pages_data

        now = datetime.now(UTC)
        operator = get_user_model().objects.create_superuser("bench-operator", password=PASSWORD)
        service = get_user_model().objects.create_user("bench-service")
        service.user_permissions.add(
            *Permission.objects.filter(codename__in=["view_communityleave", "view_signal", "view_cohort", "add_signal"])
        )
        token = token_issue(user=service)[1]
        with psycopg.connect(url, autocommit=True) as conn:
            facts = common.machine(conn)
            pages_data.fill(conn, args, service.pk, now)
            tables = conn.execute(
                "SELECT relname, reltuples::bigint, pg_total_relation_size(oid) FROM pg_class"
                " WHERE relname = ANY(%s) ORDER BY array_position(%s, relname::text)",
                [list(BIG_TABLES)] * 2,
            ).fetchall()
        gunicorn, base = common.gunicorn(children, common.child_env(), args.workers)
        api = requests.Session()
        api.headers["Authorization"] = f"Token {token}"
        # errors: answers other than 200 over HTTP; statuses: the test client's; index_scans: "node index"
        # on big tables; seq_scans: "table (path): the statement" on big tables.
        results = {
            name: {"seconds": [], "errors": [], "statuses": set(), "queries": 0, "index_scans": set(), "seq_scans": []}
            for name, _, _ in PAGES
        }
        progress(f"requests: {len(PAGES)} pages x {args.requests}, one at a time, gunicorn at {base}")
        measure(base, session_log_in(base), api, results, args, now)
        children.stop(gunicorn)
        progress("plans: each page through the test client, every statement EXPLAINed")
        explain(operator, token, results, args, now)

    workers = args.workers or 2 * len(os.sched_getaffinity(0)) + 1
    facts += [
        ("tables", ", ".join(f"{table} {count:,} rows ({size / 2**30:.2f} GiB)" for table, count, size in tables)),
        ("server", f"gunicorn, deploy/gunicorn.conf.py, {workers} sync workers, one request at a time"),
        ("requests", f"{args.requests} a page (after 2 untimed rounds), ids, slugs and filters varied"),
    ]
    found = report.Results()
    found.header = (*found.header[:2], "Queries a request; scans of the big tables", *found.header[3:])
    for name, result in results.items():
        ordered = sorted(result["seconds"])
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] * 1e3
        failed_before = len(found.failed_checks)
        found.check(not result["errors"], f"{name}: answers other than 200: {'; '.join(result['errors'][:3])}")
        found.check(result["statuses"] == {200}, f"{name}: the test client got {sorted(result['statuses'])}")
        for scan in result["seq_scans"][:3]:
            found.check(False, f"{name}: Seq Scan on {scan}")
        measured = f"p50 {statistics.median(ordered) * 1e3:,.1f} ms, p95 {p95:,.1f} ms"
        plans = f"{result['queries']} queries; " + (", ".join(sorted(result["index_scans"])) or "no big table")
        budget = f"p95 < {BUDGET_MS:g} ms, no Seq Scan on a big table"
        found.budget(name, measured, plans, "", budget, p95 < BUDGET_MS and len(found.failed_checks) == failed_before)
    passed_text = (
        "Every page answered 200 to every request, and no statement any page issued scans a big table "
        "sequentially (the plans column names the index each one reads)."
    )
    description = Path(__file__).with_name("pages.md").read_text()
    return common.finish(args, "pages.py", argv, facts, found, passed_text, (START, END), description)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
