"""The signal pipeline's budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: pipeline.py owns the database, the broker's
database number and the settings.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import math
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import psycopg
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connections

from accounts.services import token_issue
from bench import pipeline_data
from bench.common import PROJECT_DIR, gunicorn, json_answer, progress
from bench.pipeline_data import SIGNAL_TABLE, Dataset, Written, vacuum
from bench.report import Results, ms, ratio, us
from community.cache import leave_cache, leave_gate
from community.cache.gate import LeaveGate
from community.models import ChangeSource, LeaveClock
from community.services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer
from signals_app.services import processing
from signals_app.services.ingest import signals_enqueue
from signals_app.services.processing import signals_process
from support.processes import Children, wait_until

THROUGHPUT_BUDGET = 0.8  # the worker at least 0.8x the set-based floor
BARE_TABLES_BUDGET = 0.75  # the floor on the project's tables at least 0.75x on bare ones
GATE_SHARE_BUDGET = 0.02  # gate + fence under 2% of the batch
WHILE_QUEUED_SHARE_BUDGET = 0.03  # gate + fence + the while-queued check under 3% (issue 8)
WHILE_QUEUED_CHANGES = 100
INGEST_BUDGET = 0.7  # signals accepted over HTTP, at least 0.7x the bare insert of the same rows
CELERY_QUEUE = "celery"
BENCH = PROJECT_DIR / "bench"
TASK_RUNTIME = re.compile(r"Task signals_app\.tasks\.process_signal_batch\[[^\]]+\] succeeded in ([0-9.]+)s")


def rate(value: float) -> str:
    return f"{value:,.0f} signals/s"


def percent(value: float) -> str:
    return f"{value * 100:.2f}%"


@dataclass
class PipelineBench(Results):
    conn: psycopg.Connection[Any]
    data: Dataset
    args: argparse.Namespace  # pipeline.py's options
    child_env: dict[str, str]
    broker: redis.Redis
    children: Children

    def run(self) -> None:
        self.throughput(pipeline_data.expected(self.data))
        self.gate_share()
        self.ingest()
        self.sort()

    def check_written(self, label: str, want: Written) -> Written:
        written = pipeline_data.read_written(self.conn)
        for what in pipeline_data.differences(label, written, want):
            self.check(False, what)
        return written

    # --- budgets 1 and 1b: processing throughput, one Celery worker vs plain psycopg ---------

    def throughput(self, want: Written) -> None:
        count, rounds = len(self.data.signals), self.args.rounds
        results: list[dict[str, float]] = []  # a round's: the worker's figures, the floors' rates
        for number in range(1, rounds + 1):
            progress(f"round {number}/{rounds}: set-based floor, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            floor = self.run_floor()["rate"]
            floor_written = self.check_written(f"set-based floor, round {number}", want)

            # Budget 1b: the same floor on the project's tables and on bare copies of them, taking
            # turns batch by batch in one process (this machine's speed drifts by tens of percent
            # within minutes). Alone, not paired, for budget 1: the worker runs alone too.
            progress(f"round {number}/{rounds}: the same, batch by batch in turn with bare tables")
            pipeline_data.load_pending(self.conn, self.data)
            with pipeline_data.bare_copies(self.conn):
                paired = self.run_floor("--paired", pipeline_data.BARE)
            self.check_written(f"set-based floor paired with the bare one, round {number}", want)
            bare = paired["paired"]
            self.check(bare["processed"] == count, f"the bare floor processed every signal (round {number})")

            progress(f"round {number}/{rounds}: one Celery worker, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            results.append(self.run_worker() | {"floor": floor, "project": paired["rate"], "bare": bare["rate"]})
            self.check_written(f"worker vs floor, round {number}", floor_written)
            progress(f"set floor {rate(floor)}, worker {rate(results[-1]['rate'])}")

        def median(key: str) -> float:
            return statistics.median(result[key] for result in results)

        floor, product, project, bare_rate = (median(key) for key in ("floor", "rate", "project", "bare"))
        told = f"median of {rounds}" if rounds > 1 else "1 round"
        self.at_least(
            f"1. processing throughput, 1 Celery worker (prefork, concurrency 1), batches of "
            f"{settings.SIGNAL_BATCH_SIZE}, {count:,} signals, worker start to last commit ({told})",
            rate(product),
            f"{rate(floor)} (set-based SQL on plain psycopg, same writes)",
            product / floor,
            THROUGHPUT_BUDGET,
        )
        self.at_least(
            "1b. the set-based floor on the project's tables (foreign keys, indexes) vs on bare copies of them"
            f" (primary keys, the upserts' unique keys and the members' user_id index only), same data, batch by"
            f" batch in turn ({told})",
            rate(project),
            f"{rate(bare_rate)} (bare tables)",
            project / bare_rate,
            BARE_TABLES_BUDGET,
        )
        each = [f"{rate(r['rate'])} vs {rate(r['floor'])} ({r['rate'] / r['floor']:.2f}x)" for r in results]
        self.note("1. worker vs floor throughput, each round", ", ".join(each))
        each = [f"{rate(r['project'])} vs {rate(r['bare'])}" for r in results]
        self.note("1b. project's vs bare tables, each round", ", ".join(each))
        steady = median("steady")
        self.note(
            "1. worker throughput from its first batch to its last (boot excluded)",
            rate(steady),
            rate(floor),
            ratio(steady / floor),
        )
        self.note("1. worker boot: start to its first batch written", ms(median("boot")))
        cycle, inside = median("cycle"), median("inside")
        self.note(
            "1. worker per batch, median: one batch's write to the next's (inside the task, as Celery's"
            " 'succeeded in' says; between tasks: ack, next message, prefork hand-over, connection checks)",
            f"{ms(cycle)} ({ms(inside)} inside, {ms(cycle - inside)} between)",
            ms(settings.SIGNAL_BATCH_SIZE / floor),  # the floor's time a batch, at its median rate
        )

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None, **options: Any) -> Any:
        return self.children.start(name, argv, env={**self.child_env, **(env or {})}, cwd=PROJECT_DIR, **options)

    def run_floor(self, *options: str) -> dict[str, Any]:
        argv = [sys.executable, str(BENCH / "pipeline_floor.py"), self.child_env["DATABASE_URL"]]
        argv += ["--batch-size", str(settings.SIGNAL_BATCH_SIZE), *options]
        return json_answer(self.children, self.start("floor", argv), 3_600)

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
        argv += ["--hostname", "bench-pipeline@%h"]
        worker = self.start("worker", argv, keep_lines=4 * queued + 200)

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
        self.broker.flushdb()
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
        pipeline_data.load_pending(self.conn, self.data, fence=LeaveClock.objects.get().version)
        batches = [list(range(start + 1, min(start + size, count) + 1)) for start in range(0, count, size)]
        leave_cache.reset()
        leave_gate()  # warm, as worker_process_init does in a worker
        outsiders = range(max(self.data.user_ids) + 1, max(self.data.user_ids) + 1 + WHILE_QUEUED_CHANGES // 2)
        bulk_leave_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        bulk_rejoin_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        signals_process(signal_ids=batches[0])  # warm-up: the first use of each query path

        seconds: Counter[str] = Counter()  # by phase, statement, "commit" and "total"
        statements: Counter[str] = Counter()  # how many of each
        processed = 0
        with probed(seconds, statements):
            for ids in batches[1 : timed + 1]:
                started = time.perf_counter()
                processed += signals_process(signal_ids=ids).processed
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

    # --- budget 3: ingest over HTTP vs bare inserts of the same rows (bench/ingest_client.py), in turn ---

    def ingest(self) -> None:
        args = self.args
        sender = get_user_model().objects.get(pk=self.data.sender_id)  # a service account that may add signals
        sender.user_permissions.add(
            Permission.objects.get(content_type__app_label="signals_app", codename="add_signal")
        )
        sender.groups.add(Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)[0])
        token = token_issue(user=sender)[1]
        database = [self.child_env["DATABASE_URL"], "--sender-id", str(sender.pk)]
        server, base = gunicorn(self.children, self.child_env, args.ingest_workers)
        # The floor and the API take turns, a slice each, against the same server: this
        # machine's speed drifts over minutes, and a ratio of neighbours cancels the drift.
        seconds = args.ingest_seconds / args.ingest_slices
        floor: list[dict[str, Any]] = []
        served: list[dict[str, Any]] = []
        try:
            for number in range(1, args.ingest_slices + 1):
                progress(
                    f"ingest slice {number}/{args.ingest_slices}: {args.ingest_clients} clients, {seconds:g} s with "
                    f"psycopg, then {seconds:g} s over HTTP (gunicorn, {args.ingest_workers} sync workers)"
                )
                floor.append(self.run_clients("sql", database, seconds))
                stored = self.conn.execute(f"SELECT count(*) FROM {SIGNAL_TABLE}").fetchone()[0]
                self.check(
                    stored == floor[-1]["total_signals"], f"the ingest floor stored what it inserted ({stored:,})"
                )
                self.broker.flushdb()
                served.append(self.run_clients("http", [base], seconds, {"BENCH_API_TOKEN": token}))
                self.check_ingested(served[-1])
        finally:
            self.children.stop(server)
        floor_rate = sum(r["signals"] for r in floor) / args.ingest_seconds
        accepted_rate = sum(r["signals"] for r in served) / args.ingest_seconds
        self.at_least(
            f"3. ingest, POST /api/signals/ with 1,000 signals (half keyed), gunicorn {args.ingest_workers} sync "
            f"workers (deploy/gunicorn.conf.py), {args.ingest_clients} clients, {args.ingest_slices} slices of "
            f"{seconds:g} s alternated with the floor's",
            rate(accepted_rate),
            f"{rate(floor_rate)} (psycopg INSERT … unnest, {args.ingest_clients} connections)",
            accepted_rate / floor_rate,
            INGEST_BUDGET,
        )
        pairs = ", ".join(f"{h['signals'] / f['signals']:.2f}x" for f, h in zip(floor, served, strict=True))
        self.note(f"3. ingest vs floor, slice by slice ({seconds:g} s each)", pairs)
        latencies = sorted(latency for r in served for latency in r["latencies"])
        floor_latencies = [latency for r in floor for latency in r["latencies"]]
        if latencies and floor_latencies:
            p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
            self.note(
                f"3. ingest request latency, {len(latencies):,} requests in the windows",
                f"median {ms(statistics.median(latencies))}, p95 {ms(p95)}",
                f"median {ms(statistics.median(floor_latencies))} a floor batch",
            )

    def check_ingested(self, result: dict[str, Any]) -> None:
        errors, accepted = result["errors"], result["total_signals"]
        stored, keyed = self.conn.execute(f"SELECT count(*), count(idempotency_key) FROM {SIGNAL_TABLE}").fetchone()
        pending = {row[0] for row in self.conn.execute(f"SELECT id FROM {SIGNAL_TABLE} WHERE outcome = 0")}
        # The tasks waiting on the Celery queue and the signal ids they carry (no worker runs during ingest).
        messages = self.broker.lrange(CELERY_QUEUE, 0, -1)
        queued = [i for message in messages for i in json.loads(base64.b64decode(json.loads(message)["body"]))[0][0]]
        self.broker.flushdb()
        self.check(errors == 0, f"every ingest request answered 202 ({errors} did not: {result['first_error']})")
        self.check(stored == accepted, f"the API stored what it accepted ({stored:,} vs {accepted:,})")
        self.check(
            2 * keyed == stored, f"half of the ingested signals carry an idempotency key ({keyed:,} of {stored:,})"
        )
        self.check(
            sorted(queued) == sorted(pending),
            f"the API enqueued every pending signal it stored, once ({len(queued):,} ids in {len(messages):,} tasks"
            f" on Redis, {len(pending):,} pending, {stored - len(pending):,} gated on receipt)",
        )

    def run_clients(self, mode: str, target: list[str], seconds: float, env: dict[str, str] | None = None) -> Any:
        """Empty the signals, then run the clients for ``seconds`` after a warm-up; their results added up."""
        self.conn.execute(f"TRUNCATE {SIGNAL_TABLE} RESTART IDENTITY")
        vacuum(self.conn, (SIGNAL_TABLE,))
        start = time.time() + (2.0 if self.args.quick else 3.0)
        end = start + seconds
        argv = [sys.executable, str(BENCH / "ingest_client.py"), mode, *target]
        argv += ["--seed", str(self.args.seed), "--start", f"{start:.6f}", "--end", f"{end:.6f}"]
        clients = [self.start(f"client-{n}", [*argv, "--client", str(n)], env) for n in range(self.args.ingest_clients)]
        results = [json_answer(self.children, client, max(end - time.time(), 0) + 120) for client in clients]
        merged = {key: sum(r[key] for r in results) for key in ("signals", "total_signals", "errors")}
        merged["latencies"] = [latency for r in results for latency in r["latencies"]]
        merged["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
        return merged


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
    """Add up in ``seconds`` the time of gate(), the while-queued check's history read, the two gated
    steps, the commit and each other SQL statement, inside signals_process. The product's code is
    not changed: gate() is wrapped on the manager instance, SQL through Django's execute_wrapper,
    the commit on the connection object, meanwhile: one clock pair per call, a few per batch."""

    def timed(function: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - started

        return timed

    def execute(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if "leaveclock" not in sql and "leavehistory" not in sql:  # inside gate() or preload(), timed whole
                name = next((name for marker, name in STATEMENTS.items() if marker in sql), "other SQL")
                statements[name] += 1
                seconds[name] += time.perf_counter() - started

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
