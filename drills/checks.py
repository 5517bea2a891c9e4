"""Independent checks: what the stored data must be, computed from what the drill sent."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import psycopg

from drills.deployment import Deployment
from support.client import Client

Key = tuple[str, int, int, str, datetime]
Targets = dict[int, list[tuple[str, int]]]  # user id -> [(kind of target, target id)]
ATTRIBUTED, GATED = 1, 2  # signals_app_signal.outcome (0 is pending)


@dataclass(frozen=True)
class Sent:
    """One signal as the drill sent it; ``posted_at`` is time.monotonic() just before its POST was sent."""

    key: str
    user_id: int
    item_id: int
    kind: str
    weight: float
    occurred_at: datetime
    posted_at: float

    def body(self) -> dict[str, Any]:
        body = {name: getattr(self, name) for name in ("user_id", "item_id", "kind", "weight")}
        return {**body, "occurred_at": self.occurred_at.isoformat(), "idempotency_key": self.key}


def expected_aggregates(signals: Iterable[Sent], targets: Targets) -> dict[Key, tuple[int, float]]:
    """(kind of target, target id, item, kind, hour) -> (count, weight sum) for ``signals``."""
    totals: dict[Key, list[Any]] = {}
    for s in signals:
        hour = s.occurred_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        for table, target_id in targets.get(s.user_id, []):
            total = totals.setdefault((table, target_id, s.item_id, s.kind, hour), [0, 0.0])
            total[0] += 1
            total[1] += s.weight
    return {k: (v[0], round(v[1], 6)) for k, v in totals.items()}


def actual_aggregates(dep: Deployment) -> dict[Key, tuple[int, float]]:
    rows = dep.sql(
        "SELECT 'community', community_id, item_id, kind, hour, count, weight_sum FROM signals_app_communityaggregate"
        " UNION ALL "
        "SELECT 'cohort', cohort_id, item_id, kind, hour, count, weight_sum FROM signals_app_cohortaggregate"
    )
    return {(r[0], r[1], r[2], r[3], r[4].astimezone(UTC)): (r[5], round(r[6], 6)) for r in rows}


def outcomes(dep: Deployment) -> dict[str, int]:
    """idempotency key -> outcome."""
    return dict(dep.sql("SELECT idempotency_key, outcome FROM signals_app_signal WHERE idempotency_key IS NOT NULL"))


def wait_until_processed(dep: Deployment, *, timeout: float = 300) -> float:
    """Wait for no pending signal; returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(psycopg.Error):  # the database may be the thing a drill restarted
            if dep.sql("SELECT count(*) FROM signals_app_signal WHERE outcome = 0")[0][0] == 0:
                return round(time.monotonic() - started, 1)
        time.sleep(0.25)
    raise AssertionError(f"signals still pending after {timeout}s")


def setup_targets(dep: Deployment, client: Client, user_ids: list[int]) -> Targets:
    """Two communities and a cohort made through the API, every user (at most 1,000, the API's bulk
    limit) a member of each: the memberships the checks expect."""
    targets: list[tuple[str, int]] = []
    for kind, prefix, count in (("community", "communities", 2), ("cohort", "cohorts", 1)):
        for n in range(count):
            slug = f"drill-{kind}-{n}"
            status, body = client.request("POST", f"/api/{prefix}/", {"slug": slug, "name": slug})
            assert status == 201, (status, body)
            status, body = client.request("POST", f"/api/{prefix}/{slug}/members/", {"user_ids": user_ids})
            assert status == 200, (status, body)
            targets.append((kind, dep.sql(f"SELECT id FROM community_{kind} WHERE slug = %s", [slug])[0][0]))
    return {u: list(targets) for u in user_ids}


class Threads:
    """``count`` threads running ``work(index, stopping)`` from entering until leaving (or ``stopping``
    is set); ``seconds`` is how long they ran."""

    def __init__(self, work: Callable[[int, threading.Event], object], count: int) -> None:
        self.stopping = threading.Event()
        self._threads = [threading.Thread(target=work, args=(i, self.stopping), daemon=True) for i in range(count)]

    def __enter__(self) -> Self:
        self.started = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join(120)
        self.seconds = time.monotonic() - self.started


class SignalLoad(Threads):
    """Client threads posting batches of signals for ``user_ids`` until stopped or ``total`` sent: each
    accepted signal is recorded with when it was answered, other answers counted by status (0: no connection)."""

    def __init__(
        self, client: Client, user_ids: list[int], *, threads: int = 2, batch: int = 100, total: int | None = None
    ) -> None:
        super().__init__(self._post, threads)
        self.client, self.user_ids, self.batch, self.total = client, user_ids, batch, total
        self.sent: list[Sent] = []
        self.answered: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._now = datetime.now(UTC).replace(microsecond=0)

    @property
    def rate(self) -> float:
        """Signals accepted a second."""
        return round(len(self.sent) / self.seconds, 1)

    def done(self) -> bool:
        return self.total is not None and len(self.sent) >= self.total

    def _post(self, seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        while not stop.is_set() and not self.done():
            posted_at = time.monotonic()
            batch = [
                Sent(
                    key=uuid.uuid4().hex,
                    user_id=rng.choice(self.user_ids),
                    item_id=rng.randint(1, 20),
                    kind=rng.choice(("like", "view", "share")),
                    weight=rng.choice((1.0, 0.5, 2.0)),
                    occurred_at=self._now - timedelta(minutes=rng.randint(0, 120)),
                    posted_at=posted_at,
                )
                for _ in range(self.batch)
            ]
            status, _ = self.client.request("POST", "/api/signals/", {"signals": [s.body() for s in batch]})
            answered_at = time.monotonic()
            with self._lock:
                if status == 202:
                    self.sent.extend(batch)
                    self.answered.update((s.key, answered_at) for s in batch)
                else:
                    self.errors[str(status)] += 1
            if status != 202:
                time.sleep(0.2)  # back off while the service is degraded


def nothing_lost(dep: Deployment, sent: list[Sent], targets: Targets) -> tuple[dict[str, Any], bool]:
    """The exactly-once check's figures, and whether it holds: every accepted signal stored once and
    processed once, and the aggregates equal to the expectation."""
    stored = outcomes(dep)
    rows = dep.sql("SELECT count(idempotency_key), count(DISTINCT idempotency_key) FROM signals_app_signal")[0]
    expected = expected_aggregates(sent, targets)
    actual = actual_aggregates(dep)
    found = {
        "accepted": len(sent),
        "stored": rows[0],
        "missing": sum(1 for s in sent if s.key not in stored),
        "duplicated": rows[0] - rows[1],
        "pending": sum(1 for s in sent if stored.get(s.key) == 0),
        "aggregates_match": actual == expected,
        "aggregate_rows": len(actual),
        "counted": sum(v[0] for v in actual.values()),
        "expected_counted": sum(v[0] for v in expected.values()),
    }
    return found, found["aggregates_match"] and not (found["missing"] or found["duplicated"] or found["pending"])


def server_errors(statuses: dict[str, int]) -> int:
    return sum(count for status, count in statuses.items() if status.startswith("5"))


def loss_figures(dep: Deployment, load: SignalLoad, targets: Targets) -> tuple[dict[str, Any], bool]:
    """A fault drill's figures after the drain; it passes when nothing was lost or counted twice and
    no request got a server error."""
    drain = wait_until_processed(dep)
    lost, passed = nothing_lost(dep, load.sent, targets)
    figures = {
        "signals_per_second": load.rate,
        "drain_seconds": drain,
        "checks": lost,
        "http_errors": dict(load.errors),
    }
    return figures, passed and not server_errors(load.errors)


def caches(dep: Deployment, client: Client, *, samples: int = 12) -> tuple[dict[str, Any], bool]:
    """Every web and worker process's cache against the records (web pid or worker name -> matches), and
    whether at least one process of each kind was seen and every one matches. Each request opens a new
    connection, so the samples spread over gunicorn's workers; a Celery worker reports in its own log."""
    web: dict[int, bool] = {}
    for _ in range(samples):
        status, body = client.request("GET", "/api/leave-cache/?compare=1")
        if status == 200:
            web[body["pid"]] = web.get(body["pid"], True) and body["matches_database"]
    tasks = "from community.tasks import report_leave_cache\nfor _ in range(8): report_leave_cache.delay()"
    dep.manage("shell", "-c", tasks)
    names, workers = dep.workers(), {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(workers) < len(names):
        for name in names:
            reports = [line for line in dep.log_since_start(name).splitlines() if "leave cache report:" in line]
            if reports:
                workers[name] = all("matches_database=True" in line for line in reports)
        time.sleep(0.5)
    return {"web_caches": web, "worker_caches": workers}, all(seen and all(seen.values()) for seen in (web, workers))
