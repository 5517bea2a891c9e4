"""The signal pipeline's budgets 1, 1b and 2, each measured against a floor taken in the same
run (budget 3 is bench/pipeline_ingest.py).

Imported only after ``django.setup()``: pipeline.py owns the database, the broker's
database number and the settings.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import connections

from bench import pipeline_data
from bench.common import PROJECT_DIR, json_answer, progress
from bench.pipeline_data import SIGNAL_TABLE, Dataset, Written
from bench.pipeline_ingest import CELERY_QUEUE, Ingest, rate
from bench.report import Results, ms, ratio, us
from community.cache import leave_cache, leave_gate
from community.cache.gate import LeaveGate
from community.models import ChangeSource, LeaveClock
from community.services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer
from signals_app.services import processing
from signals_app.services.ingest import signals_enqueue
from signals_app.services.processing import signals_process
from support.processes import Child, Children

THROUGHPUT_BUDGET = 0.8  # the worker at least 0.8x the set-based floor
BARE_TABLES_BUDGET = 0.75  # the floor on the project's tables at least 0.75x on bare ones
GATE_SHARE_BUDGET = 0.02  # gate + fence under 2% of the batch
WHILE_QUEUED_SHARE_BUDGET = 0.03  # gate + fence + the while-queued check under 3% (issue 8)
WHILE_QUEUED_CHANGES = 100
FLOOR_PHASES = {
    "lock": "lock pending rows (SELECT … FOR UPDATE SKIP LOCKED)",
    "python": "Python (the gate, the columns)",
    "writes": "the statement: membership joins, 2 upserts, the outcomes",
    "commit": "COMMIT",
}
TASK_RUNTIME = re.compile(r"Task signals_app\.tasks\.process_signal_batch\[[^\]]+\] succeeded in ([0-9.]+)s")


def percent(value: float) -> str:
    return f"{value * 100:.2f}%"


@dataclass
class PipelineBench(Ingest, Results):
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
        floors: list[float] = []
        pairs: list[tuple[float, float]] = []  # budget 1b: (project's tables, bare tables), in turn
        runs: list[dict[str, float]] = []
        floor_phases: Counter[str] = Counter()
        for number in range(1, rounds + 1):
            progress(f"round {number}/{rounds}: set-based floor, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            result = self.run_floor()
            floors.append(result["processed"] / result["seconds"])
            floor_phases.update(result["phases"])
            floor_written = self.check_written(f"set-based floor, round {number}", want)

            # Budget 1b: the same floor on the project's tables and on bare copies of them, taking
            # turns batch by batch in one process (this machine's speed drifts by tens of percent
            # within minutes). Alone, not paired, for budget 1: the worker runs alone too.
            progress(f"round {number}/{rounds}: the same, batch by batch in turn with bare tables")
            pipeline_data.load_pending(self.conn, self.data)
            pipeline_data.make_bare_copies(self.conn)
            try:
                result = self.run_floor("--paired", pipeline_data.BARE)
            finally:
                pipeline_data.drop_bare_copies(self.conn)
            self.check_written(f"set-based floor paired with the bare one, round {number}", want)
            bare = result["paired"]
            self.check(bare["processed"] == count, f"the bare floor processed every signal (round {number})")
            pairs.append((result["processed"] / result["seconds"], bare["processed"] / bare["seconds"]))

            progress(f"round {number}/{rounds}: one Celery worker, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            runs.append(self.run_worker())
            self.check_written(f"worker vs floor, round {number}", floor_written)
            progress(f"set floor {rate(floors[-1])}, worker {rate(runs[-1]['rate'])}")

        def median(key: str) -> float:
            return statistics.median(run[key] for run in runs)

        floor, product = statistics.median(floors), median("rate")
        project, bare_rate = (statistics.median(side) for side in zip(*pairs, strict=True))
        told = f"median of {rounds}" if rounds > 1 else "1 round"
        tasks = math.ceil(count / settings.SIGNAL_BATCH_SIZE)
        self.at_least(
            f"1. processing throughput, 1 Celery worker (prefork, concurrency 1), batches of "
            f"{settings.SIGNAL_BATCH_SIZE}, {count:,} signals, worker start to last commit ({told})",
            rate(product),
            f"{rate(floor)} (set-based SQL on plain psycopg, same writes)",
            product / floor,
            THROUGHPUT_BUDGET,
        )
        self.at_least(
            "1b. the set-based floor on the project's tables (indexes, constraints) vs on bare copies of them"
            f" (primary keys, the upserts' unique keys and the members' user_id index only), same data, batch by"
            f" batch in turn ({told})",
            rate(project),
            f"{rate(bare_rate)} (bare tables)",
            project / bare_rate,
            BARE_TABLES_BUDGET,
        )
        each = ", ".join(
            f"{rate(run['rate'])} vs {rate(f)} ({run['rate'] / f:.2f}x)" for run, f in zip(runs, floors, strict=True)
        )
        self.note("1. worker vs floor throughput, each round", each)
        self.note("1b. project's vs bare tables, each round", ", ".join(f"{rate(p)} vs {rate(b)}" for p, b in pairs))
        steady = median("steady")
        self.note(
            "1. worker throughput from its first batch to its last (boot excluded)",
            rate(steady),
            rate(floor),
            ratio(steady / floor),
        )
        self.note("1. worker boot: start to its first batch written", ms(median("boot")))
        floor_batch = sum(floor_phases.values()) / (tasks * rounds)
        cycle, inside = median("cycle"), median("inside")  # inside: NaN without task lines in the log
        self.note(
            "1. worker per batch, median: one batch's write to the next's (inside the task, as Celery's"
            " 'succeeded in' says; between tasks: ack, next message, prefork hand-over, connection checks)",
            f"{ms(cycle)} ({ms(inside)} inside, {ms(cycle - inside)} between)" if not math.isnan(inside) else ms(cycle),
            ms(floor_batch),
        )
        self.note(
            "1. worker: PostgreSQL sessions opened during its run (pg_stat_database.sessions)",
            f"{median('sessions'):,.0f} for {tasks:,} tasks",
            "1 (the floor's one connection)",
        )
        for phase, seconds in floor_phases.items():
            per_batch = seconds / (tasks * rounds)
            self.note(f"1. floor per batch: {FLOOR_PHASES[phase]}", us(per_batch), "", percent(per_batch / floor_batch))

    def run_floor(self, *options: str) -> dict[str, Any]:
        argv = [sys.executable, str(PROJECT_DIR / "bench" / "pipeline_floor.py"), self.child_env["DATABASE_URL"]]
        argv += ["--batch-size", str(settings.SIGNAL_BATCH_SIZE), *options]
        child = self.children.start("floor", argv, env=self.child_env, cwd=PROJECT_DIR)
        return json_answer(self.children, child, 3_600)

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
        sessions_before = self.sessions()
        worker = self.children.start("worker", argv, env=self.child_env, cwd=PROJECT_DIR, keep_lines=4 * queued + 200)
        try:
            self.wait_processed(worker, count)
        finally:
            self.children.stop(worker)
        sessions = self.sessions() - sessions_before
        left_in_queue = self.broker.llen(CELERY_QUEUE)
        self.check(left_in_queue == 0, f"the worker consumed every task (left in the queue: {left_in_queue})")
        self.broker.flushdb()
        query = f"SELECT DISTINCT processed_at FROM {SIGNAL_TABLE} ORDER BY processed_at"
        moments = [row[0].timestamp() for row in self.conn.execute(query)]
        self.check(
            len(moments) == tasks,
            f"the worker processed the signals in {tasks} batches (found {len(moments)} processing times)",
        )
        # Only for information: absent if the project's logging ever hides Celery's task lines.
        runtimes = [float(seconds) for seconds in TASK_RUNTIME.findall(worker.output())]
        first, last = moments[0], moments[-1]
        return {
            "rate": count / (last - worker.started),  # from the worker's start to its last batch's processed_at
            "steady": (count - count / len(moments)) / (last - first) if last > first else math.nan,
            "boot": first - worker.started,
            "cycle": statistics.median(b - a for a, b in itertools.pairwise(moments)) if last > first else math.nan,
            "inside": statistics.median(runtimes) if runtimes else math.nan,
            "sessions": sessions,
        }

    def sessions(self) -> int:
        """Sessions ever opened on this database (PostgreSQL 14+), as the statistics say after a flush."""
        time.sleep(1.1)  # backends report their statistics at most once a second
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0])

    def wait_processed(self, worker: Child, count: int) -> None:
        """Wait until nothing is queued, then until nothing is pending (the timing itself comes from
        ``processed_at``). The queue's length is read from Redis, so that polling costs the database
        nothing while the worker runs, except for its last batches."""
        last_seen, last_change, last_note = -1, time.monotonic(), time.monotonic()
        while True:
            queued = self.broker.llen(CELERY_QUEUE)
            pending_sql = f"SELECT count(*) FROM {SIGNAL_TABLE} WHERE outcome = 0"
            pending = queued * settings.SIGNAL_BATCH_SIZE if queued else self.conn.execute(pending_sql).fetchone()[0]
            if pending == 0:
                return
            now = time.monotonic()
            if not worker.running:
                raise RuntimeError(f"the worker exited ({worker.proc.returncode}):\n{worker.tail()}")
            if pending != last_seen:
                last_seen, last_change = pending, now
            elif now - last_change > 120:
                raise RuntimeError(f"no progress in 120 s, {pending:,} pending; worker output:\n{worker.tail()}")
            if now - last_note > 10:
                progress(f"about {count - pending:,} of {count:,} processed")
                last_note = now
            time.sleep(0.5 if queued else 0.1)

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

        probe = Probe()
        with probe.installed():
            for ids in batches[1 : timed + 1]:
                started = time.perf_counter()
                probe.processed += signals_process(signal_ids=ids).processed
                probe.seconds["total"] += time.perf_counter() - started
        self.check(probe.processed == timed * size, f"the timed batches processed {timed * size:,} signals")
        self.check(probe.seconds["steps"] > 0, "signals_process ran the two gated steps (timed by the probe)")

        seconds = probe.seconds
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
        self.note(
            "2. signals_process in this process, no Celery (time inside signals_process only)",
            rate(probe.processed / total),
        )
        self.note("2. signals_process per batch, all of it", ms(total / timed), "", "100%")
        for phase, spent in probe.breakdown(timed).items():
            self.note(f"2. signals_process per batch: {phase}", us(spent / timed), "", percent(spent / total))


class Probe:
    """Times, inside signals_process, gate(), the while-queued check's history read, the two gated
    steps, each SQL statement and the commit. The product's code is not changed: gate() is
    wrapped on the manager instance, SQL through Django's execute_wrapper, the commit on the
    connection object, for the time of ``installed()``: one clock pair per call, a few per batch."""

    STATEMENTS = (
        ("lock pending rows (SELECT … FOR UPDATE SKIP LOCKED)", "FOR UPDATE"),
        ("credit and mark (one statement: the membership joins, both upserts, the outcomes)", "ON CONFLICT"),
    )
    PHASES = {
        "gate": "gate() (the fence read, one query)",
        "preload": "gate.preload() (the while-queued check: nothing to read when the feed covers it)",
        "steps": "the two gated steps (the gate applied to the batch's users)",
    }

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()  # by PHASES key, statement name, "commit" and "total"
        self.statements: Counter[str] = Counter()
        self.processed = 0

    def execute(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            if "leaveclock" not in sql and "leavehistory" not in sql:  # inside gate() or preload(), timed whole
                name = next((name for name, marker in self.STATEMENTS if marker in sql), "other SQL")
                self.statements[name] += 1
                self.seconds[name] += elapsed

    @contextmanager
    def installed(self) -> Iterator[None]:
        db = connections["default"]
        wrapped = [
            (leave_cache, "sync", "gate"),
            (db, "_commit", "commit"),
            (LeaveGate, "preload", "preload"),
            (processing, "try_cohort_attribution", "steps"),
            (processing, "try_community_forwarding", "steps"),
        ]
        originals = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in wrapped]
        for owner, name, key in wrapped:
            setattr(owner, name, self.timed(getattr(owner, name), key))
        try:
            with db.execute_wrapper(self.execute):
                yield
        finally:
            for owner, name, original in originals:
                if original is None:
                    delattr(owner, name)  # an instance's attribute: the class's method shows again
                else:
                    setattr(owner, name, original)

    def timed(self, function: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - started

        return timed

    def breakdown(self, batches: int) -> dict[str, float]:
        """Seconds by phase; a statement's name says how many of it a batch runs."""
        phases = {label: self.seconds[key] for key, label in self.PHASES.items()}
        phases |= {f"{name}, {n / batches:g} a batch": self.seconds[name] for name, n in self.statements.items()}
        phases["COMMIT"] = self.seconds["commit"]
        phases["Python (the rest: ORM, building the rows)"] = self.seconds["total"] - sum(phases.values())
        return phases
