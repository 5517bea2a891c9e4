"""What the pages benchmark requests (bench/pages.py): every page with a sampler of its paths,
timed one request at a time over HTTP, then run through Django's test client with every
statement it issued EXPLAINed."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bench.common import progress

CONSOLE = "/admin/community/communityleave/console"
EXPLAINED_PER_PAGE = 8


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


def fixed(path: str) -> Sampler:
    return lambda i, r, c: path


def cycled(template: str, choices: list[Any]) -> Sampler:
    """``template`` with the request's turn of ``choices`` in its ``{}``."""
    return lambda i, r, c: template.format(_cycle(i, choices))


def user(template: str) -> Sampler:
    """``template`` with a user id (``_user``) in its ``{}``."""
    return lambda i, r, c: template.format(_user(i, r, c))


def drawn(template: str, among: str) -> Sampler:
    """``template`` with a number from 1 to the context's ``among`` (signals, communities, ...) in its ``{}``."""
    return lambda i, r, c: template.format(r.randint(1, getattr(c, among)))


KINDS = ["view", "like", "share", "comment", "save", "click", "follow", "report"]
SIGNALS = "/admin/signals_app/signal/"
RECORDS = "/admin/community/communityleave/"
HISTORY = "/admin/community/leavehistory/"
COMMUNITY_AGGREGATES = "/admin/signals_app/communityaggregate/"
COHORT_AGGREGATES = "/admin/signals_app/cohortaggregate/"
LAST = ["1h", "24h", "7d", "30d"]
S, T = "session", "token"

PAGES = [
    Page("admin: signals", S, fixed(SIGNALS)),
    Page("admin: signals, page 2 to 9", S, lambda i, r, c: f"{SIGNALS}?p={2 + i % 8}"),
    Page("admin: signals by outcome", S, cycled(SIGNALS + "?outcome__exact={}", [2, 4, 0, 3, 1])),
    Page("admin: signals by gated reason", S, cycled(SIGNALS + "?gated_reason__exact={}", [4, 1, 2, 3])),
    Page("admin: signals by kind", S, cycled(SIGNALS + "?kind={}", KINDS[::-1])),
    Page("admin: signals received in the last …", S, cycled(SIGNALS + "?received={}", LAST)),
    Page(
        "admin: signals by outcome and kind",
        S,
        lambda i, r, c: f"{SIGNALS}?outcome__exact={_cycle(i, [2, 3])}&kind={_cycle(i, ['report', 'view', 'like'])}",
    ),
    Page("admin: signals, search by user id", S, user(SIGNALS + "?q={}")),
    Page("admin: a signal", S, drawn(SIGNALS + "{}/change/", "signals")),
    Page("admin: leave records", S, fixed(RECORDS)),
    Page("admin: leave records by status", S, cycled(RECORDS + "?status={}", ["corrupt", "active", "left"])),
    Page("admin: leave records, search by user id", S, user(RECORDS + "?q={}")),
    Page("admin: a leave record", S, user(RECORDS + "{}/change/")),
    Page("admin: history", S, fixed(HISTORY)),
    Page("admin: a history entry", S, drawn(HISTORY + "{}/change/", "history")),
    Page(
        "admin: history by action or source",
        S,
        cycled(
            HISTORY + "?{}",
            ["source__exact=command", "action__exact=rejoin", "source__exact=admin", "action__exact=leave"],
        ),
    ),
    Page("admin: history changed in the last …", S, cycled(HISTORY + "?changed={}", LAST)),
    Page("admin: history, search by user id", S, user(HISTORY + "?q={}")),
    Page("admin: community aggregates", S, fixed(COMMUNITY_AGGREGATES)),
    Page(
        "admin: community aggregates by community",
        S,
        drawn(COMMUNITY_AGGREGATES + "?community__id__exact={}", "communities"),
    ),
    Page("admin: community aggregates by kind", S, cycled(COMMUNITY_AGGREGATES + "?kind={}", KINDS[::-1])),
    Page("admin: cohort aggregates", S, fixed(COHORT_AGGREGATES)),
    Page("admin: cohort aggregates by cohort", S, drawn(COHORT_AGGREGATES + "?cohort__id__exact={}", "cohorts")),
    Page("console: dashboard", S, fixed(f"{CONSOLE}/")),
    Page("console: a user's page", S, user(CONSOLE + "/user/{}/")),
    Page("console: bulk leave form", S, fixed(f"{CONSOLE}/bulk-leave/")),
    Page("API: status", T, user("/api/community-layer/{}/")),
    Page("API: a user's history", T, user("/api/community-layer/{}/history/")),
    Page("API: a user's signals", T, user("/api/community-layer/{}/signals/")),
    Page("API: trending (default window)", T, drawn("/api/communities/c{}/trending/", "communities")),
    Page(
        "API: trending, a kind, the last 7 days",
        T,
        lambda i, r, c: (
            f"/api/communities/c{r.randint(1, c.communities)}/trending/"
            f"?kind={_cycle(i, KINDS)}&since={_since(c, 7 * 24)}&limit=50"
        ),
    ),
    Page("API: attribution (default window)", T, drawn("/api/cohorts/k{}/attribution/", "cohorts")),
    Page(
        "API: attribution, the last 7 days",
        T,
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
