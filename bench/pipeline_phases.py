"""The signal pipeline's data and budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: pipeline.py owns the database, the broker and the settings.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import math
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import patch

import psycopg
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connections

from accounts.services import token_issue
from bench import pipeline_floor as floor
from bench import tools
from bench.common import PROJECT_DIR, child_env, gunicorn, json_answer, progress
from bench.pipeline_floor import AGGREGATE_TABLES, GROUP_TABLES, KINDS, MEMBER_TABLES, SIGNAL_TABLE, TARGETS, WEIGHTS
from bench.report import Results, ms, ratio, us
from community.cache import leave_cache, leave_gate
from community.cache.gate import LeaveGate
from community.models import ChangeSource, Cohort, CohortMember, Community, CommunityLeave, CommunityMember, LeaveClock
from community.services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer
from signals_app.models import CohortAggregate, CommunityAggregate, GatedReason, Outcome, Signal
from signals_app.services import processing
from signals_app.services.ingest import signals_enqueue
from support.processes import Children, wait_until

# The floor runs without Django: its tables and codes must be the models'.
BARE_TABLES = (SIGNAL_TABLE, *AGGREGATE_TABLES, *MEMBER_TABLES)  # those bare_copies copies
MODELS = (Signal, CommunityAggregate, CohortAggregate, CommunityMember, CohortMember, Community, Cohort, CommunityLeave)
assert [model._meta.db_table for model in MODELS] == [*BARE_TABLES, *GROUP_TABLES, floor.LEAVE_TABLE]
FLOOR_CODES = (floor.ATTRIBUTED, floor.GATED, floor.NO_TARGET, floor.LEFT_AT_PROCESSING)
assert FLOOR_CODES == (Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET, GatedReason.LEFT_AT_PROCESSING)

COMMUNITIES, COHORTS, ITEMS, HOURS = 100, 30, 5_000, 24
MAX_COMMUNITIES, MAX_COHORTS = 6, 4  # each user in 0..6 communities (3 on average), 0..4 cohorts (2)
LEFT_SHARE = 0.10
KIND_WEIGHTS = (70, 15, 5, 10)  # of KINDS
THROUGHPUT_BUDGET = 0.8  # the worker at least 0.8x the set-based floor
BARE_TABLES_BUDGET = 0.75  # the floor on the project's tables at least 0.75x on bare ones
GATE_SHARE_BUDGET = 0.02  # gate + fence under 2% of the batch
WHILE_QUEUED_SHARE_BUDGET = 0.03  # gate + fence + the while-queued check under 3% (issue 8)
WHILE_QUEUED_CHANGES = 100
INGEST_BUDGET = 0.7  # signals accepted over HTTP, at least 0.7x the bare insert of the same rows
CELERY_QUEUE = "celery"
FLOOR = [sys.executable, str(PROJECT_DIR / "bench" / "pipeline_floor.py")]
TASK_RUNTIME = re.compile(r"Task signals_app\.tasks\.process_signal_batch\[[^\]]+\] succeeded in ([0-9.]+)s")
BARE = "bare_"


@dataclass
class Dataset:
    """Everything drawn from one seed: every load of the pending signals holds the same rows under
    the same ids, and what processing them must write is computed from it, in Python."""

    base: datetime  # the first hour signals occur in
    sender_id: int
    user_ids: list[int]
    communities: dict[int, list[int]]  # user id -> community ids
    cohorts: dict[int, list[int]]  # user id -> cohort ids
    left: set[int]
    signals: list[tuple[int, int, int, str, float, datetime]]  # (id, user_id, item_id, kind, weight, occurred_at)


def create(conn: psycopg.Connection[Any], signals: int, users: int, seed: int) -> Dataset:
    """The sender, communities, cohorts, memberships (a binary COPY) and leaves (through
    ``bulk_leave_community_layer``, chunks of 1,000); the pending signals drawn, not loaded."""
    sender = get_user_model().objects.create_user(username="bench-sender")
    rng = random.Random(seed)
    now = datetime.now(UTC)
    base = (now - timedelta(hours=HOURS)).replace(minute=0, second=0, microsecond=0)
    user_ids = rng.sample(range(1, 10 * users + 1), users)
    tools.make_groups(conn, COMMUNITIES, COHORTS, now)
    groups = [[row[0] for row in conn.execute(f"SELECT id FROM {table} ORDER BY id")] for table in GROUP_TABLES]
    members: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})  # of communities, of cohorts
    for user_id in user_ids:
        for joined, ids, most in zip(members, groups, (MAX_COMMUNITIES, MAX_COHORTS), strict=True):
            if chosen := rng.sample(ids, rng.randint(0, most)):
                joined[user_id] = sorted(chosen)
    for table, target, joined in zip(MEMBER_TABLES, TARGETS, members, strict=True):
        rows = ((target_id, user_id, now) for user_id, target_ids in joined.items() for target_id in target_ids)
        tools.copy_rows(conn, table, f"{target}, user_id, joined_at", ["int8", "int8", "timestamptz"], rows)
    leavers = rng.sample(user_ids, round(users * LEFT_SHARE))
    for start in range(0, len(leavers), 1_000):
        bulk_leave_community_layer(user_ids=leavers[start : start + 1_000], source=ChangeSource.COMMAND)

    rng = random.Random(seed + 1)
    zipf = list(itertools.accumulate(1.0 / rank for rank in range(1, ITEMS + 1)))  # a few popular items, a long tail
    span = HOURS * 3_600_000_000  # microseconds
    drawn = zip(
        range(1, signals + 1),
        rng.choices(user_ids, k=signals),
        rng.choices(range(1, ITEMS + 1), cum_weights=zipf, k=signals),
        rng.choices(KINDS, weights=KIND_WEIGHTS, k=signals),
        rng.choices(WEIGHTS, k=signals),
        [base + timedelta(microseconds=rng.randrange(span)) for _ in range(signals)],
        strict=True,
    )
    return Dataset(base, sender.pk, user_ids, *members, set(leavers), list(drawn))


def load_pending(conn: psycopg.Connection[Any], data: Dataset, *, fence: int | None = None) -> None:
    """Empty the signals and both aggregates, then load every signal as pending, same ids,
    received at leave clock version ``fence`` (None: no receipt fence)."""
    received, sender, pending = data.base + timedelta(hours=HOURS), data.sender_id, Outcome.PENDING.value
    tables = (SIGNAL_TABLE, *AGGREGATE_TABLES)
    conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")
    columns = "id, sender_id, user_id, item_id, kind, weight, occurred_at, received_at, outcome, fence_at_receipt"
    types = ["int8", "int4", "int8", "int8", "varchar", "float8", "timestamptz", "timestamptz", "int2", "int8"]
    rows = ((i, sender, u, item, kind, w, at, received, pending, fence) for i, u, item, kind, w, at in data.signals)
    tools.copy_rows(conn, SIGNAL_TABLE, columns, types, rows, vacuum=False)
    conn.execute(f"SELECT setval(pg_get_serial_sequence('{SIGNAL_TABLE}', 'id'), %s)", (len(data.signals),))
    vacuum(conn, tables)


def vacuum(conn: psycopg.Connection[Any], tables: tuple[str, ...]) -> None:
    """Each run starts from settled tables with clean buffers: none pays for the writes of the run before it."""
    for table in tables:
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("CHECKPOINT")


@contextmanager
def bare_copies(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Meanwhile, copies of the pipeline's tables with the same rows and nothing but what the set-based
    statement needs: primary keys, the upserts' unique keys, an index of members by user."""
    conn.execute(f"CREATE TABLE {BARE}{SIGNAL_TABLE} AS SELECT * FROM {SIGNAL_TABLE}")
    conn.execute(f"ALTER TABLE {BARE}{SIGNAL_TABLE} ADD PRIMARY KEY (id)")
    for table, target in zip(AGGREGATE_TABLES, TARGETS, strict=True):
        conn.execute(f"CREATE TABLE {BARE}{table} (LIKE {table} INCLUDING DEFAULTS INCLUDING IDENTITY)")
        conn.execute(f"ALTER TABLE {BARE}{table} ADD UNIQUE ({target}, hour, item_id, kind)")
    for table in MEMBER_TABLES:
        conn.execute(f"CREATE TABLE {BARE}{table} AS SELECT * FROM {table}")
        conn.execute(f"CREATE INDEX ON {BARE}{table} (user_id)")
    vacuum(conn, tuple(BARE + table for table in BARE_TABLES))
    try:
        yield
    finally:
        for table in BARE_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {BARE}{table}")


def expected(data: Dataset) -> dict[str, dict[Any, Any]]:
    """What processing every signal must write: the outcome by signal id and, by aggregate table,
    (target id, hour, item id, kind) -> (count, weight sum, last time)."""
    want: dict[str, dict[Any, Any]] = {"outcomes": {}, **{table: {} for table in AGGREGATE_TABLES}}
    for signal_id, user_id, item_id, kind, weight, occurred_at in data.signals:
        targets = (data.communities.get(user_id, []), data.cohorts.get(user_id, []))
        if user_id in data.left:
            want["outcomes"][signal_id] = floor.GATED
            continue
        want["outcomes"][signal_id] = floor.ATTRIBUTED if targets[0] or targets[1] else floor.NO_TARGET
        hour = occurred_at.replace(minute=0, second=0, microsecond=0)
        for table, target_ids in zip(AGGREGATE_TABLES, targets, strict=True):
            for target_id in target_ids:
                key = (target_id, hour, item_id, kind)
                count, weight_sum, last = want[table].get(key, (0, 0.0, occurred_at))
                want[table][key] = (count + 1, weight_sum + weight, max(last, occurred_at))
    return want


def rate(value: float) -> str:
    return f"{value:,.0f} signals/s"


def percent(value: float) -> str:
    return f"{value * 100:.2f}%"


@dataclass
class PipelineBench(Results):
    conn: psycopg.Connection[Any]
    data: Dataset
    args: argparse.Namespace  # pipeline.py's options
    broker: redis.Redis
    children: Children

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, **options: Any) -> Any:
        return self.children.start(name, argv, env={**child_env(), **(env or {})}, cwd=PROJECT_DIR, **options)

    def check_written(self, label: str, want: dict[str, dict[Any, Any]]) -> dict[str, dict[Any, Any]]:
        """Check that a run wrote ``want``, row for row; what it wrote."""
        got = {"outcomes": dict(self.conn.execute(f"SELECT id, outcome FROM {SIGNAL_TABLE}").fetchall())}
        for table, target in zip(AGGREGATE_TABLES, TARGETS, strict=True):
            rows = self.conn.execute(f"SELECT {target}, hour, item_id, kind, count, weight_sum, last_at FROM {table}")
            got[table] = {tuple(row[:4]): tuple(row[4:]) for row in rows}
        for name, rows in want.items():
            if got[name] != rows:
                differing = sum(1 for key in got[name].keys() | rows.keys() if got[name].get(key) != rows.get(key))
                self.check(
                    False,
                    f"{label}: {name} differ ({len(got[name]):,} rows vs {len(rows):,}, {differing:,} of them"
                    " missing, extra or with other values)",
                )
        pending = list(got["outcomes"].values()).count(Outcome.PENDING)
        self.check(pending == 0, f"{label}: {pending:,} signals left pending")
        return got

    # --- budgets 1 and 1b: processing throughput, one Celery worker vs plain psycopg ---------

    def throughput(self) -> None:
        count, rounds, want = len(self.data.signals), self.args.rounds, expected(self.data)
        results: list[dict[str, float]] = []  # a round's: the worker's figures, the floors' rates
        for number in range(1, rounds + 1):
            progress(f"round {number}/{rounds}: set-based floor, {count:,} pending signals")
            load_pending(self.conn, self.data)
            rates = {"floor": self.run_floor()["rate"]}
            floor_written = self.check_written(f"set-based floor, round {number}", want)

            progress(f"round {number}/{rounds}: Python-loop floor, {count:,} pending signals")
            load_pending(self.conn, self.data)
            rates["loop"] = self.run_floor("--python-loop")["rate"]
            self.check_written(f"Python-loop floor, round {number}", want)

            # Budget 1b: the same floor on the project's tables and on bare copies of them, taking
            # turns batch by batch in one process (this machine's speed drifts by tens of percent
            # within minutes). Alone, not paired, for budget 1: the worker runs alone too.
            progress(f"round {number}/{rounds}: the set-based floor, batch by batch in turn with bare tables")
            load_pending(self.conn, self.data)
            with bare_copies(self.conn):
                project = self.run_floor("--paired", BARE)
            self.check_written(f"set-based floor paired with the bare one, round {number}", want)
            bare = project.pop("paired")
            self.check(bare["processed"] == count, f"the bare floor processed every signal (round {number})")
            rates |= {"project": project["rate"], "bare": bare["rate"]}

            progress(f"round {number}/{rounds}: one Celery worker, {count:,} pending signals")
            load_pending(self.conn, self.data)
            results.append(self.run_worker() | rates)
            self.check_written(f"worker vs floor, round {number}", floor_written)
            progress(f"set floor {rate(rates['floor'])}, worker {rate(results[-1]['rate'])}")

        median = {key: statistics.median(result[key] for result in results) for key in results[0]}
        told = f"median of {rounds}" if rounds > 1 else "1 round"
        self.at_least(
            f"1. processing throughput, 1 Celery worker (prefork, concurrency 1), batches of "
            f"{settings.SIGNAL_BATCH_SIZE}, {count:,} signals, worker start to last commit ({told})",
            rate(median["rate"]),
            f"{rate(median['floor'])} (set-based SQL on plain psycopg, same writes)",
            median["rate"] / median["floor"],
            THROUGHPUT_BUDGET,
        )
        self.at_least(
            "1b. the set-based floor on the project's tables (foreign keys, indexes) vs on bare copies of them"
            f" (primary keys, the upserts' unique keys and the members' user_id index only), same data, batch by"
            f" batch in turn ({told})",
            rate(median["project"]),
            f"{rate(median['bare'])} (bare tables)",
            median["project"] / median["bare"],
            BARE_TABLES_BUDGET,
        )
        self.note(
            "1. the Python-loop floor (plain psycopg, per batch a lock and a read of the memberships, the gate and"
            f" the sums in a Python loop, an upsert of each aggregate, the mark) vs the set-based floor ({told})",
            rate(median["loop"]),
            rate(median["floor"]),
            ratio(median["loop"] / median["floor"]),
        )
        self.note(
            "1. worker throughput from its first batch to its last (boot excluded)",
            f"{rate(median['steady'])} (boot: {ms(median['boot'])} from its start to its first batch written)",
            rate(median["floor"]),
            ratio(median["steady"] / median["floor"]),
        )
        cycle, inside = median["cycle"], median["inside"]
        self.note(
            "1. worker per batch, median: one batch's write to the next's (inside the task, as Celery's"
            " 'succeeded in' says; between tasks: ack, next message, prefork hand-over, connection checks)",
            f"{ms(cycle)} ({ms(inside)} inside, {ms(cycle - inside)} between)",
            ms(settings.SIGNAL_BATCH_SIZE / median["floor"]),  # the floor's time a batch, at its median rate
        )

    def run_floor(self, *options: str) -> dict[str, Any]:
        return json_answer(self.children, self.start("floor", [*FLOOR, "process", *options]), 3_600)

    def run_worker(self) -> dict[str, float]:
        """Enqueue every pending signal, start one worker, wait until none is pending; its figures."""
        count = len(self.data.signals)
        self.broker.flushdb()
        signals_enqueue(list(range(1, count + 1)))
        queued = self.broker.llen(CELERY_QUEUE)
        tasks = math.ceil(count / settings.SIGNAL_BATCH_SIZE)
        self.check(queued == tasks, f"{tasks} tasks queued before the worker starts (found {queued})")
        argv = [sys.executable, "-m", "celery", "-A", "tidalproject", "worker", "--pool=prefork", "--concurrency=1"]
        # INFO: one "succeeded in" line a task, read below for the time spent inside each task.
        argv += ["--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
        worker = self.start("worker", [*argv, "--hostname", "bench-pipeline@%h"], keep_lines=4 * queued + 200)

        def done() -> bool:  # the queue's length from Redis: polling costs the database nothing meanwhile
            if not worker.running:
                raise RuntimeError(f"the worker exited ({worker.proc.returncode}):\n{worker.tail()}")
            if self.broker.llen(CELERY_QUEUE):
                return False
            return self.conn.execute(f"SELECT count(*) FROM {SIGNAL_TABLE} WHERE outcome = 0").fetchone()[0] == 0

        try:  # the timing itself comes from processed_at
            wait_until(done, timeout=3_600, interval=0.5, what="the worker to process every signal")
        finally:
            self.children.stop(worker)
        left_in_queue = self.broker.llen(CELERY_QUEUE)
        self.check(left_in_queue == 0, f"the worker consumed every task (left in the queue: {left_in_queue})")
        query = f"SELECT DISTINCT processed_at FROM {SIGNAL_TABLE} ORDER BY processed_at"
        moments = [row[0].timestamp() for row in self.conn.execute(query)]
        self.check(
            len(moments) == tasks,
            f"the worker processed the signals in {tasks} batches (found {len(moments)} processing times)",
        )
        # Only for information: NaN if the project's logging ever hides Celery's task lines.
        runtimes = [float(seconds) for seconds in TASK_RUNTIME.findall(worker.output())] or [math.nan]
        return {
            "rate": count / (moments[-1] - worker.started),  # from its start to its last batch's processed_at
            "steady": (count - count / len(moments)) / (moments[-1] - moments[0]),  # the first batch not counted
            "boot": moments[0] - worker.started,
            "cycle": statistics.median(b - a for a, b in itertools.pairwise(moments)),
            "inside": statistics.median(runtimes),
        }

    # --- budgets 2 and 2b: the gate's and the fence's share of a batch -----------------------

    def gate_share(self) -> None:
        size, count = settings.SIGNAL_BATCH_SIZE, len(self.data.signals)
        timed = min(30 if self.args.quick else 100, count // size - 1)
        progress(f"signals_process in this process: 1 warm-up + {timed} timed batches")
        # Every signal received at the current clock version; then, after the worker warmed,
        # leaves and rejoins of users without signals here: every signal's fence window holds
        # changes, so the while-queued check runs for each (from the feed, in memory), and
        # the outcomes stay those the data says.
        load_pending(self.conn, self.data, fence=LeaveClock.objects.get().version)
        batches = [list(range(start + 1, min(start + size, count) + 1)) for start in range(0, count, size)]
        leave_cache.reset()
        leave_gate()  # warm, as worker_process_init does in a worker
        outsiders = range(max(self.data.user_ids) + 1, max(self.data.user_ids) + 1 + WHILE_QUEUED_CHANGES // 2)
        bulk_leave_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        bulk_rejoin_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        processing.signals_process(signal_ids=batches[0])  # warm-up: the first use of each query path

        seconds: Counter[str] = Counter()  # by phase, statement, "commit" and "total"
        statements: Counter[str] = Counter()  # how many of each
        processed = 0
        with probed(seconds, statements):
            for ids in batches[1 : timed + 1]:
                started = time.perf_counter()
                processed += processing.signals_process(signal_ids=ids).processed
                seconds["total"] += time.perf_counter() - started
        self.check(processed == timed * size, f"the timed batches processed {timed * size:,} signals")
        self.check(seconds["steps"] > 0, "signals_process ran the two gated steps (timed by the probe)")

        total = seconds["total"]
        gated = seconds["gate"] + seconds["steps"]
        self.share_below(
            f"2. gate() (fence) + the two gated steps, share of signals_process time, {timed} batches of {size}",
            f"{percent(gated / total)} ({us(gated / timed)} of {ms(total / timed)} a batch)",
            gated / total,
            GATE_SHARE_BUDGET,
        )
        queued = gated + seconds["preload"]
        self.share_below(
            f"2b. the same with the while-queued check ({WHILE_QUEUED_CHANGES} changes in every signal's"
            " window) and the evidence written",
            f"{percent(queued / total)} ({us(queued / timed)} a batch)",
            queued / total,
            WHILE_QUEUED_SHARE_BUDGET,
        )
        self.note("2. signals_process per batch, all of it (in this process, no Celery)", ms(total / timed), "", "100%")
        phases = {label: seconds[key] for key, label in PROBED.items()}
        phases |= {f"{name}, {n / timed:g} a batch": seconds[name] for name, n in statements.items()}
        phases["Python (the rest: ORM, building the rows)"] = total - sum(phases.values())
        for phase, spent in phases.items():
            self.note(f"2. signals_process per batch: {phase}", us(spent / timed), "", percent(spent / total))

    # --- budget 3: ingest over HTTP vs bare inserts of the same rows, in turn ---------------------

    def ingest(self) -> None:
        args = self.args
        sender = get_user_model().objects.get(pk=self.data.sender_id)  # a service account that may add signals
        permission = Permission.objects.get(content_type__app_label="signals_app", codename="add_signal")
        sender.user_permissions.add(permission)
        sender.groups.add(Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)[0])
        token = token_issue(user=sender)[1]
        server, base = gunicorn(self.children, child_env(), args.ingest_workers)
        # The floor and the API take turns, a slice each, against the same server: this
        # machine's speed drifts over minutes, and a ratio of neighbours cancels the drift.
        seconds = args.ingest_seconds / args.ingest_slices
        floor_signals: list[int] = []
        served_signals: list[int] = []
        try:
            for number in range(1, args.ingest_slices + 1):
                progress(
                    f"ingest slice {number}/{args.ingest_slices}: {args.ingest_clients} clients, {seconds:g} s with "
                    f"psycopg, then {seconds:g} s over HTTP (gunicorn, {args.ingest_workers} sync workers)"
                )
                floor_signals.append(self.run_clients("sql", ["--sender-id", str(sender.pk)], seconds))
                served_signals.append(self.run_clients("http", ["--url", base], seconds, {"BENCH_API_TOKEN": token}))
        finally:
            self.children.stop(server)
        floor_rate, accepted_rate = sum(floor_signals) / args.ingest_seconds, sum(served_signals) / args.ingest_seconds
        self.at_least(
            f"3. ingest, POST /api/signals/ with 1,000 signals (half keyed), gunicorn {args.ingest_workers} sync "
            f"workers (deploy/gunicorn.conf.py), {args.ingest_clients} clients, {args.ingest_slices} slices of "
            f"{seconds:g} s alternated with the floor's",
            rate(accepted_rate),
            f"{rate(floor_rate)} (psycopg INSERT … unnest, {args.ingest_clients} connections)",
            accepted_rate / floor_rate,
            INGEST_BUDGET,
        )
        pairs = ", ".join(f"{h / f:.2f}x" for f, h in zip(floor_signals, served_signals, strict=True))
        self.note(f"3. ingest vs floor, slice by slice ({seconds:g} s each)", pairs)

    def run_clients(self, mode: str, options: list[str], seconds: float, env: dict[str, str] | None = None) -> int:
        """Empty the signals and the broker, run the clients in ``mode`` for ``seconds`` after a warm-up and
        check what they stored (over HTTP, what the API enqueued too); the signals they got in within the
        counted window."""
        self.conn.execute(f"TRUNCATE {SIGNAL_TABLE} RESTART IDENTITY")
        self.broker.flushdb()
        vacuum(self.conn, (SIGNAL_TABLE,))
        start = time.time() + (2.0 if self.args.quick else 3.0)
        end = start + seconds
        argv = [*FLOOR, mode, *options, "--seed", str(self.args.seed), "--start", f"{start:.6f}", "--end", f"{end:.6f}"]
        clients = [self.start(f"client-{n}", [*argv, "--client", str(n)], env) for n in range(self.args.ingest_clients)]
        results = [json_answer(self.children, client, max(end - time.time(), 0) + 120) for client in clients]
        errors, sent = (sum(result[key] for result in results) for key in ("errors", "total_signals"))
        first_error = next((result["first_error"] for result in results if result["first_error"]), "")
        stored, keyed = self.conn.execute(f"SELECT count(*), count(idempotency_key) FROM {SIGNAL_TABLE}").fetchone()
        who = "the API" if mode == "http" else "the ingest floor"
        self.check(errors == 0, f"every request to {who} succeeded, 202 over HTTP ({errors} did not: {first_error})")
        self.check(stored == sent, f"{who} stored what it accepted ({stored:,} vs {sent:,})")
        self.check(
            2 * keyed == stored, f"half of what {who} stored carries an idempotency key ({keyed:,} of {stored:,})"
        )
        if mode == "http":  # the tasks on the Celery queue and the signal ids they carry (no worker runs meanwhile)
            pending = {row[0] for row in self.conn.execute(f"SELECT id FROM {SIGNAL_TABLE} WHERE outcome = 0")}
            messages = self.broker.lrange(CELERY_QUEUE, 0, -1)
            queued = [i for m in messages for i in json.loads(base64.b64decode(json.loads(m)["body"]))[0][0]]
            self.check(
                sorted(queued) == sorted(pending),
                f"the API enqueued every pending signal it stored, once ({len(queued):,} ids in {len(messages):,}"
                f" tasks on Redis, {len(pending):,} pending, {stored - len(pending):,} gated on receipt)",
            )
        return sum(result["signals"] for result in results)


PROBED = {
    "gate": "gate() (the fence read, one query)",
    "preload": "gate.preload() (the while-queued check: nothing to read when the feed covers it)",
    "steps": "the two gated steps (the gate applied to the batch's users)",
    "commit": "COMMIT",
}
STATEMENTS = {
    "FOR UPDATE": "lock pending rows (SELECT … FOR UPDATE SKIP LOCKED)",
    "ON CONFLICT": "credit and mark (one statement: the membership joins, both upserts, the outcomes)",
}


@contextmanager
def probed(seconds: Counter[str], statements: Counter[str]) -> Iterator[None]:
    """Meanwhile, add up in ``seconds`` the time of gate(), the while-queued check's history read, the
    two gated steps, the commit and each other SQL statement inside signals_process, one clock pair a
    call. The product's code is not changed: gate() is wrapped on the manager instance, SQL through
    Django's execute_wrapper, the commit on the connection object."""

    def timed(function: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = function(*args, **kwargs)
            seconds[key] += time.perf_counter() - started
            return result

        return timed

    def execute(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        started = time.perf_counter()
        result = execute(sql, params, many, context)
        if "leaveclock" not in sql and "leavehistory" not in sql:  # inside gate() or preload(), timed whole
            name = next((name for marker, name in STATEMENTS.items() if marker in sql), "other SQL")
            statements[name] += 1
            seconds[name] += time.perf_counter() - started
        return result

    db = connections["default"]
    wrapped = [
        (leave_cache, "sync", "gate"),
        (db, "_commit", "commit"),
        (LeaveGate, "preload", "preload"),
        (processing, "try_cohort_attribution", "steps"),
        (processing, "try_community_forwarding", "steps"),
    ]
    with ExitStack() as stack:  # patch puts each back as it was: an instance's attribute is deleted
        for owner, name, key in wrapped:
            stack.enter_context(patch.object(owner, name, timed(getattr(owner, name), key)))
        stack.enter_context(db.execute_wrapper(execute))
        yield
