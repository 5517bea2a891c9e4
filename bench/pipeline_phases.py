"""The signal pipeline's budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: pipeline.py owns the database, the broker's
database number and the settings.
"""

from __future__ import annotations

import base64
import cProfile
import itertools
import json
import math
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.contrib.auth.models import Group, Permission

from accounts.services import token_issue
from bench import pipeline_data, pipeline_floor, tools
from bench.common import gunicorn, progress
from bench.pipeline_data import SIGNAL_TABLE, Dataset, Expected, Written
from bench.pipeline_probe import CountingGate, Probe, top_functions
from bench.report import Results, ms, ratio, us
from community.models import ChangeSource, CommunityLeave, LeaveClock
from community.services import bulk_leave_community_layer, bulk_rejoin_community_layer
from signals_app.models import Outcome
from signals_app.services import enqueue_signal_processing, process_signals
from support.processes import Child, Children

THROUGHPUT_BUDGET = 0.8  # the worker at least 0.8x the set-based floor
BARE_TABLES_BUDGET = 0.75  # the floor on the project's tables at least 0.75x on bare ones
GATE_SHARE_BUDGET = 0.02  # gate + fence under 2% of the batch
WHILE_QUEUED_SHARE_BUDGET = 0.03  # gate + fence + the while-queued check under 3% (issue 8)
WHILE_QUEUED_CHANGES = 100
INGEST_BUDGET = 0.7  # signals accepted over HTTP, at least 0.7x the bare insert of the same rows

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR.parent
PENDING_SQL = f"SELECT count(*) FROM {SIGNAL_TABLE} WHERE outcome = 0"
CELERY_QUEUE = "celery"


@dataclass(frozen=True)
class Options:
    rounds: int  # floor/product pairs for budget 1, alternated
    profile_batches: int  # timed process_signals batches for budget 2
    cprofile_batches: int  # further batches run under cProfile (and counting the gate calls)
    lookup_rounds: int
    ingest_seconds: float
    ingest_warmup: float
    ingest_clients: int
    ingest_workers: int
    seed: int
    extras: bool = True  # measure what each index and constraint costs the floor


FLOOR_PHASES = {
    "lock": "lock pending rows (SELECT … FOR UPDATE SKIP LOCKED)",
    "memberships": "memberships (1 SELECT … UNION ALL)",
    "python": "Python (the gate, the increments, the columns)",
    "writes": "2 upserts + 1 UPDATE of the outcomes (one round trip)",
    "commit": "COMMIT",
}
TASK_RUNTIME = re.compile(r"Task signals_app\.tasks\.process_signal_batch\[[^\]]+\] succeeded in ([0-9.]+)s")


@dataclass(frozen=True)
class WorkerRun:
    signals: int
    started: float  # epoch seconds, just before the worker was spawned
    batch_moments: list[float]  # each batch's processed_at, in order
    runtimes: list[float]  # seconds inside each task, from the worker's log
    sessions: int  # PostgreSQL sessions opened on the database while the worker ran

    @property
    def rate(self) -> float:
        """From the worker's start to its last batch's processed_at."""
        return self.signals / (self.batch_moments[-1] - self.started)

    @property
    def steady_rate(self) -> float:
        """From its first batch's processed_at to its last's: the first batch is not counted."""
        span = self.batch_moments[-1] - self.batch_moments[0]
        return (self.signals - self.signals / len(self.batch_moments)) / span if span > 0 else math.nan

    @property
    def boot(self) -> float:
        return self.batch_moments[0] - self.started

    @property
    def cycles(self) -> list[float]:
        moments = self.batch_moments
        return [later - earlier for earlier, later in itertools.pairwise(moments)] or [math.nan]


def rate(value: float) -> str:
    return f"{value:,.0f} signals/s"


def percent(value: float) -> str:
    return f"{value * 100:.2f}%"


@dataclass
class PipelineBench(Results):
    conn: psycopg.Connection[Any]
    data: Dataset
    options: Options
    child_env: dict[str, str]
    broker: redis.Redis
    children: Children
    profile_text: str = ""

    def run(self) -> None:
        self.check_tables()
        want = pipeline_data.expected(self.data)
        self.throughput(want)
        self.gate_share()
        self.ingest()
        self.sort()

    def check_tables(self) -> None:
        for name in ("SIGNAL", "COMMUNITY_AGGREGATE", "COHORT_AGGREGATE", "COMMUNITY_MEMBER", "COHORT_MEMBER"):
            assert getattr(pipeline_floor, f"{name}_TABLE") == getattr(pipeline_data, f"{name}_TABLE"), name
        assert CommunityLeave._meta.db_table == pipeline_floor.LEAVE_TABLE
        floor_outcomes = (pipeline_floor.ATTRIBUTED, pipeline_floor.GATED, pipeline_floor.NO_TARGET)
        assert floor_outcomes == (Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET)

    def python(self, script: str) -> list[str]:
        return [sys.executable, str(BENCH_DIR / script)]

    # --- budget 1: processing throughput, one Celery worker vs plain psycopg ---------------

    def throughput(self, want: Expected) -> None:
        count = len(self.data.signals)
        floors: list[float] = []
        loops: list[float] = []
        runs: list[WorkerRun] = []
        floor_phases: Counter[str] = Counter()
        for round_number in range(1, self.options.rounds + 1):
            progress(f"round {round_number}/{self.options.rounds}: Python-loop floor, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            result = self.run_floor()
            loops.append(result["processed"] / result["seconds"])
            self.check_written(f"Python-loop floor, round {round_number}", want)

            progress(f"round {round_number}/{self.options.rounds}: set-based floor, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            result = self.run_floor(set_based=True)
            floors.append(result["processed"] / result["seconds"])
            floor_phases.update(result["phases"])
            floor_written = self.check_written(f"set-based floor, round {round_number}", want)

            progress(f"round {round_number}/{self.options.rounds}: one Celery worker, {count:,} pending signals")
            pipeline_data.load_pending(self.conn, self.data)
            run = self.run_worker()
            runs.append(run)
            written = pipeline_data.read_written(self.conn)
            self.check(written.pending == 0, f"the worker left no signal pending (round {round_number})")
            differ = pipeline_data.differences(f"worker vs floor, round {round_number}", written, floor_written)
            self.check(
                not differ, f"the worker wrote the same aggregates and outcomes as the floor (round {round_number})"
            )
            for what in differ:
                self.check(False, what)
            progress(f"set floor {rate(floors[-1])}, worker {rate(run.rate)} ({run.rate / floors[-1]:.2f}x)")

        floor, product = statistics.median(floors), statistics.median(run.rate for run in runs)
        steady = statistics.median(run.steady_rate for run in runs)
        rounds = f"median of {len(floors)}" if len(floors) > 1 else "1 round"
        shown = ", ".join(rate(run.rate) for run in runs)
        self.at_least(
            f"1. processing throughput, 1 Celery worker (prefork, concurrency 1), batches of "
            f"{settings.SIGNAL_BATCH_SIZE}, {count:,} signals, worker start to last commit ({rounds})",
            rate(product),
            f"{rate(floor)} (set-based SQL on plain psycopg, same writes)",
            product / floor,
            THROUGHPUT_BUDGET,
        )
        loop = statistics.median(loops)
        self.note("1. the Python-loop floor (per-signal increments in Python, then upserts)", rate(loop))
        bare = self.bare_floor()
        if self.options.extras:
            self.extras_cost(bare)
        self.at_least(
            "1b. the set-based floor on the project's tables (foreign keys, indexes) vs on bare copies of them"
            " (primary keys, the upserts' unique keys and the members' user_id index only), same data",
            rate(floor),
            f"{rate(bare)} (bare tables)",
            floor / bare,
            BARE_TABLES_BUDGET,
        )
        self.note("1. worker throughput of each round", shown)
        self.note("1. floor throughput of each round", ", ".join(rate(value) for value in floors))
        steady_line = "1. worker throughput from its first batch to its last (boot excluded)"
        self.note(steady_line, rate(steady), rate(floor), ratio(steady / floor))
        boot = statistics.median(run.boot for run in runs)
        self.note("1. worker boot: start to its first batch written", ms(boot))
        batches = math.ceil(count / settings.SIGNAL_BATCH_SIZE) * len(floors)
        floor_batch = sum(floor_phases.values()) / batches
        cycle = statistics.median(statistics.median(run.cycles) for run in runs)
        inside = statistics.median(statistics.median(run.runtimes) for run in runs)  # NaN without log lines
        self.note("1. worker per batch: one batch's write to the next's (median)", ms(cycle), ms(floor_batch))
        self.note(
            "1. worker per batch: inside the task (Celery's 'succeeded in', median)",
            ms(inside) if not math.isnan(inside) else "n/a (no task lines in the worker's log)",
        )
        self.note(
            "1. worker per batch: between tasks (ack, next message, prefork hand-over, connection checks)",
            ms(cycle - inside) if not math.isnan(inside) else "n/a",
        )
        sessions = statistics.median(run.sessions for run in runs)
        self.note(
            "1. worker: PostgreSQL sessions opened during its run (pg_stat_database.sessions)",
            f"{sessions:,.0f} for {math.ceil(count / settings.SIGNAL_BATCH_SIZE):,} tasks",
            "1 (the floor's one connection)",
        )
        for phase, seconds in floor_phases.items():
            share = percent(seconds / batches / floor_batch)
            self.note(f"1. floor per batch: {FLOOR_PHASES[phase]}", us(seconds / batches), "", share)

    def check_written(self, label: str, want: Expected) -> Written:
        written = pipeline_data.read_written(self.conn)
        self.check(written.pending == 0, f"{label}: no signal left pending")
        for what in pipeline_data.differences(label, written, want):
            self.check(False, what)
        return written

    def bare_floor(self, extra: str = "") -> float:
        """The set-based floor on bare copies of the tables, with the same pending signals
        (and ``extra``, one of the product's indexes or constraints, added to them)."""
        progress(f"set-based floor on bare copies of the tables{' with ' + extra.split(' ON ')[0] if extra else ''}")
        pipeline_data.load_pending(self.conn, self.data)
        pipeline_data.make_bare_copies(self.conn)
        try:
            if extra:
                self.conn.execute(extra)
            result = self.run_floor(set_based=True, prefix=pipeline_data.BARE)
        finally:
            pipeline_data.drop_bare_copies(self.conn)
        self.check(result["processed"] == len(self.data.signals), "the bare floor processed every signal")
        rate_: float = result["processed"] / result["seconds"]
        return rate_

    def extras_cost(self, bare: float) -> None:
        """What each of the product's indexes and constraints costs the set-based floor: the
        bare copies with that one added."""
        for name, statement in pipeline_data.product_extras(self.conn):
            with_it = self.bare_floor(statement)
            self.note(f"1b. bare tables + {name}", rate(with_it), rate(bare), ratio(with_it / bare))

    def run_floor(self, *, set_based: bool = False, prefix: str = "") -> dict[str, Any]:
        argv = [*self.python("pipeline_floor.py"), self.child_env["DATABASE_URL"]]
        argv += ["--batch-size", str(settings.SIGNAL_BATCH_SIZE)]
        argv += ["--set-based"] if set_based else []
        argv += ["--prefix", prefix] if prefix else []
        return json_answer(
            self.children, self.children.start("floor", argv, env=self.child_env, cwd=PROJECT_DIR), 3_600
        )

    def run_worker(self) -> WorkerRun:
        """Enqueue every pending signal, start one worker, wait until none is pending."""
        count = len(self.data.signals)
        self.broker.flushdb()
        enqueue_signal_processing(list(range(1, count + 1)))
        queued = self.broker.llen(CELERY_QUEUE)
        expected_tasks = math.ceil(count / settings.SIGNAL_BATCH_SIZE)
        self.check(queued == expected_tasks, f"{expected_tasks} tasks queued before the worker starts (found {queued})")
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
        moments = [
            row[0].timestamp()
            for row in self.conn.execute(f"SELECT DISTINCT processed_at FROM {SIGNAL_TABLE} ORDER BY processed_at")
        ]
        self.check(
            len(moments) == expected_tasks,
            f"the worker processed the signals in {expected_tasks} batches (found {len(moments)} processing times)",
        )
        # Only for information: absent if the project's logging ever hides Celery's task lines.
        runtimes = [float(seconds) for seconds in TASK_RUNTIME.findall(worker.output())]
        return WorkerRun(count, worker.started, moments, runtimes or [math.nan], sessions)

    def sessions(self) -> int:
        """Sessions ever opened on this database (PostgreSQL 14+), as the statistics say after a flush."""
        time.sleep(1.1)  # backends report their statistics at most once a second
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0])

    def wait_processed(self, worker: Child, count: int) -> None:
        """Wait until nothing is queued, then until nothing is pending; the timing itself comes
        from ``processed_at``. The queue's length is read from Redis, so that polling costs the
        database nothing while the worker runs, except for its last batches."""
        size = settings.SIGNAL_BATCH_SIZE
        last_seen, last_change, last_note = -1, time.monotonic(), time.monotonic()
        while True:
            queued = self.broker.llen(CELERY_QUEUE)
            pending = queued * size if queued else self.conn.execute(PENDING_SQL).fetchone()[0]
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

    # --- budget 2: the gate's and the fence's share of a batch ------------------------------

    def gate_share(self) -> None:
        opts = self.options
        size = settings.SIGNAL_BATCH_SIZE
        count = len(self.data.signals)
        timed = min(opts.profile_batches, count // size - opts.cprofile_batches - 1)
        progress(
            f"process_signals in this process: 1 warm-up + {timed} timed + {opts.cprofile_batches} profiled batches"
        )
        # Every signal received at the current clock version; then, after the worker warmed,
        # leaves and rejoins of users without signals here: every signal's fence window holds
        # changes, so the while-queued check runs for each (from the feed, in memory), and
        # the outcomes stay those the data says.
        fence = LeaveClock.objects.get().version
        pipeline_data.load_pending(self.conn, self.data, fence=fence)
        batches = [list(range(start + 1, min(start + size, count) + 1)) for start in range(0, count, size)]
        CommunityLeave.objects.cache.reset()
        CommunityLeave.objects.gate()  # warm, as worker_process_init does in a worker
        outsiders = range(max(self.data.user_ids) + 1, max(self.data.user_ids) + 1 + WHILE_QUEUED_CHANGES // 2)
        bulk_leave_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        bulk_rejoin_community_layer(user_ids=outsiders, source=ChangeSource.COMMAND)
        process_signals(signal_ids=batches[0])  # warm-up: the first use of each query path

        probe = Probe()
        with probe.installed():
            for ids in batches[1 : timed + 1]:
                probe.batch(ids)
        self.check(probe.processed == timed * size, f"the timed batches processed {timed * size:,} signals")

        counting = CountingGate.install()
        profiler = cProfile.Profile()
        try:
            profiler.enable()
            for ids in batches[timed + 1 : timed + 1 + opts.cprofile_batches]:
                process_signals(signal_ids=ids)
            profiler.disable()
        finally:
            counting.uninstall()
        profiled = opts.cprofile_batches * size
        calls_per_signal = counting.calls / profiled if profiled else 2.0
        # Counted, not assumed (2 today: one in each gated step); none would mean the wrapping missed the gate.
        self.check(counting.calls > 0, "process_signals calls gate.is_left (counted through a wrapped gate)")
        self.profile_text = top_functions(profiler, 18)

        # The look-up's own cost, on the very user ids of the timed batches, through the real gate.
        gate = CommunityLeave.objects.gate()
        user_ids = [row[1] for row in self.data.signals[size : (timed + 1) * size]]
        lookups = tools.statement_rounds(
            {"loop": "for user_id in ids: pass", "gate": "for user_id in ids: gate.is_left(user_id, since=fence)"},
            {"ids": user_ids, "gate": gate, "fence": fence},
            opts.lookup_rounds,
        )
        per_call = (lookups["gate"].median - lookups["loop"].median) / len(user_ids)

        total = probe.total
        lookup_time = per_call * calls_per_signal * probe.processed
        share = (probe.gate + lookup_time) / total
        per_batch = total / timed
        self.share_below(
            f"2. gate() (fence) + is_left look-ups, share of process_signals time, {timed} batches of {size}",
            f"{percent(share)} ({us((probe.gate + lookup_time) / timed)} of {ms(per_batch)} a batch)",
            share,
            GATE_SHARE_BUDGET,
        )
        with_queued = (probe.gate + probe.preload + lookup_time) / total
        self.share_below(
            f"2b. the same with the while-queued check ({WHILE_QUEUED_CHANGES} changes in every signal's"
            " window) and the evidence written",
            f"{percent(with_queued)} ({us((probe.gate + probe.preload + lookup_time) / timed)} a batch)",
            with_queued,
            WHILE_QUEUED_SHARE_BUDGET,
        )
        gate_line = "2. gate() per batch: the fence (one clock read), nothing changed"
        self.note(gate_line, us(probe.gate / timed), "", percent(probe.gate / total))
        self.note(
            f"2. is_left per call (timeit, median of {opts.lookup_rounds}, net of the loop) "
            f"x {calls_per_signal:g} calls a signal",
            f"{per_call * 1e9:,.1f} ns; {us(lookup_time / timed)} a batch",
            "",
            percent(lookup_time / total),
        )
        in_process = probe.processed / total
        self.note("2. process_signals in this process, no Celery (time inside process_signals only)", rate(in_process))
        self.note("2. process_signals per batch, all of it", ms(per_batch), "", "100%")
        for phase, seconds in probe.breakdown().items():
            self.note(f"2. process_signals per batch: {phase}", us(seconds / timed), "", percent(seconds / total))

    # --- budget 3: ingest over HTTP ----------------------------------------------------------

    def ingest(self) -> None:
        opts = self.options
        sender = self.ingest_sender()
        token = token_issue(user=sender)[1]

        progress(f"ingest floor: {opts.ingest_clients} clients inserting with psycopg for {opts.ingest_seconds:g} s")
        self.empty_signals()
        floor = self.run_clients("sql", [self.child_env["DATABASE_URL"], "--sender-id", str(sender.pk)])
        floor_rate = floor["signals"] / opts.ingest_seconds
        stored = self.conn.execute(f"SELECT count(*) FROM {SIGNAL_TABLE}").fetchone()[0]
        self.check(stored == floor["total_signals"], f"the ingest floor stored what it inserted ({stored:,})")

        self.empty_signals()
        self.broker.flushdb()
        result = self.serve_clients(token)
        accepted_rate = result["signals"] / opts.ingest_seconds
        self.check_ingested(result)
        self.at_least(
            f"3. ingest, POST /api/signals/ with 1,000 signals (half keyed), gunicorn {opts.ingest_workers} sync "
            f"workers (deploy/gunicorn.conf.py), {opts.ingest_clients} clients, {opts.ingest_seconds:g} s",
            rate(accepted_rate),
            f"{rate(floor_rate)} (psycopg INSERT … unnest, {opts.ingest_clients} connections)",
            accepted_rate / floor_rate,
            INGEST_BUDGET,
        )
        latencies = sorted(result["latencies"])
        if latencies:
            p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
            self.note(
                f"3. ingest request latency, {len(latencies):,} requests in the window",
                f"median {ms(statistics.median(latencies))}, p95 {ms(p95)}",
                f"median {ms(statistics.median(floor['latencies']))} a floor batch" if floor["latencies"] else "",
            )

    def serve_clients(self, token: str) -> dict[str, Any]:
        """Start gunicorn, run the HTTP clients against it, stop it."""
        opts = self.options
        server, base = gunicorn(self.children, self.child_env, opts.ingest_workers)
        try:
            progress(
                f"ingest: gunicorn, {opts.ingest_workers} sync workers; {opts.ingest_clients} clients posting "
                f"1,000-signal batches for {opts.ingest_seconds:g} s"
            )
            return self.run_clients("http", [base], env={"BENCH_API_TOKEN": token})
        finally:
            self.children.stop(server)

    def check_ingested(self, result: dict[str, Any]) -> None:
        errors, accepted = result["errors"], result["total_signals"]
        stored, keyed = self.conn.execute(f"SELECT count(*), count(idempotency_key) FROM {SIGNAL_TABLE}").fetchone()
        pending = {row[0] for row in self.conn.execute(f"SELECT id FROM {SIGNAL_TABLE} WHERE outcome = 0")}
        tasks, queued = queued_signal_ids(self.broker)
        self.broker.flushdb()
        self.check(errors == 0, f"every ingest request answered 202 ({errors} did not: {result['first_error']})")
        self.check(stored == accepted, f"the API stored what it accepted ({stored:,} vs {accepted:,})")
        self.check(
            2 * keyed == stored, f"half of the ingested signals carry an idempotency key ({keyed:,} of {stored:,})"
        )
        self.check(
            queued == pending,
            f"the API enqueued every pending signal it stored, once ({len(queued):,} ids in {tasks:,} tasks on "
            f"Redis, {len(pending):,} pending, {stored - len(pending):,} gated on receipt)",
        )

    def ingest_sender(self) -> Any:
        from django.contrib.auth import get_user_model

        sender = get_user_model().objects.get(pk=self.data.sender_id)
        sender.user_permissions.add(
            Permission.objects.get(content_type__app_label="signals_app", codename="add_signal")
        )
        group, _ = Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)
        sender.groups.add(group)
        return sender

    def empty_signals(self) -> None:
        self.conn.execute(f"TRUNCATE {SIGNAL_TABLE} RESTART IDENTITY")
        self.conn.execute(f"VACUUM ANALYZE {SIGNAL_TABLE}")
        self.conn.execute("CHECKPOINT")

    def run_clients(self, mode: str, target: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        opts = self.options
        start = time.time() + opts.ingest_warmup
        end = start + opts.ingest_seconds
        argv = [*self.python("ingest_client.py"), mode, *target, "--start", f"{start:.6f}", "--end", f"{end:.6f}"]
        argv += ["--seed", str(opts.seed)]
        clients = [
            self.children.start(
                f"client-{n}", [*argv, "--client", str(n)], env={**self.child_env, **(env or {})}, cwd=PROJECT_DIR
            )
            for n in range(opts.ingest_clients)
        ]
        results = [json_answer(self.children, client, max(end - time.time(), 0) + 120) for client in clients]
        merged: dict[str, Any] = {
            key: sum(r[key] for r in results)
            for key in ("requests", "signals", "total_requests", "total_signals", "errors")
        }
        merged["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
        merged["latencies"] = [latency for r in results for latency in r["latencies"]]
        return merged


def queued_signal_ids(broker: redis.Redis) -> tuple[int, set[int]]:
    """The tasks waiting on the Celery queue, and the signal ids they carry (empty if any is there twice)."""
    ids: list[int] = []
    messages = broker.lrange(CELERY_QUEUE, 0, -1)
    for message in messages:
        args, _, _ = json.loads(base64.b64decode(json.loads(message)["body"]))
        ids.extend(args[0])
    unique = set(ids)
    return len(messages), unique if len(unique) == len(ids) else set()


def json_answer(children: Children, child: Child, timeout: float) -> dict[str, Any]:
    """What a child prints last, one line of JSON, once it exits; it is stopped in any case."""
    try:
        code = child.wait(timeout=timeout)
    finally:
        children.stop(child)
    if code != 0:
        raise RuntimeError(f"{child.name} failed ({code}):\n{child.tail()}")
    answer: dict[str, Any] = json.loads(child.output().strip().splitlines()[-1])
    return answer
