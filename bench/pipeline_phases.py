"""The signal pipeline's budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: pipeline.py owns the database, the broker's
database number and the settings.
"""

from __future__ import annotations

import cProfile
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from django.conf import settings

from bench import pipeline_data, pipeline_floor
from bench.common import PROJECT_DIR, json_answer, progress
from bench.pipeline_data import Dataset, Expected, Written
from bench.pipeline_ingest import Ingest, rate
from bench.pipeline_probe import Probe, top_functions
from bench.pipeline_worker import Worker, WorkerRun
from bench.report import Results, ms, ratio, us
from community.cache import leave_cache, leave_gate
from community.models import ChangeSource, Cohort, Community, CommunityLeave, LeaveClock
from community.services.layer import bulk_leave_community_layer, bulk_rejoin_community_layer
from signals_app.models import Outcome
from signals_app.services.processing import signals_process
from support.processes import Children

THROUGHPUT_BUDGET = 0.8  # the worker at least 0.8x the set-based floor
BARE_TABLES_BUDGET = 0.75  # the floor on the project's tables at least 0.75x on bare ones
GATE_SHARE_BUDGET = 0.02  # gate + fence under 2% of the batch
WHILE_QUEUED_SHARE_BUDGET = 0.03  # gate + fence + the while-queued check under 3% (issue 8)
WHILE_QUEUED_CHANGES = 100


@dataclass(frozen=True)
class Options:
    rounds: int  # floor/product pairs for budget 1, alternated
    profile_batches: int  # timed signals_process batches for budget 2
    cprofile_batches: int  # further batches run under cProfile (the report's profile)
    ingest_seconds: float  # counted, in all, on each side
    ingest_slices: int  # turns the floor and the API take, ingest_seconds / ingest_slices each
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


def percent(value: float) -> str:
    return f"{value * 100:.2f}%"


@dataclass
class PipelineBench(Ingest, Worker, Results):
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
        assert (Community._meta.db_table, Cohort._meta.db_table) == (
            pipeline_floor.COMMUNITY_TABLE,
            pipeline_floor.COHORT_TABLE,
        )
        floor_outcomes = (pipeline_floor.ATTRIBUTED, pipeline_floor.GATED, pipeline_floor.NO_TARGET)
        assert floor_outcomes == (Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET)

    # --- budget 1: processing throughput, one Celery worker vs plain psycopg ---------------

    def throughput(self, want: Expected) -> None:
        count = len(self.data.signals)
        floors: list[float] = []
        pairs: list[tuple[float, float]] = []  # budget 1b: (project's tables, bare tables), in turn
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

            # Budget 1b: the same floor on the project's tables and on bare copies of them, taking
            # turns batch by batch in one process (this machine's speed drifts by tens of percent
            # within minutes). Alone, not paired, for budget 1: the worker runs alone too.
            progress(f"round {round_number}/{self.options.rounds}: the same, batch by batch in turn with bare tables")
            pipeline_data.load_pending(self.conn, self.data)
            pipeline_data.make_bare_copies(self.conn)
            try:
                result = self.run_floor(set_based=True, paired=pipeline_data.BARE)
            finally:
                pipeline_data.drop_bare_copies(self.conn)
            self.check_written(f"set-based floor paired with the bare one, round {round_number}", want)
            paired = result["paired"]
            self.check(paired["processed"] == count, f"the bare floor processed every signal (round {round_number})")
            pairs.append((result["processed"] / result["seconds"], paired["processed"] / paired["seconds"]))

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
        project, bare = (statistics.median(side) for side in zip(*pairs, strict=True))
        if self.options.extras:
            self.extras_cost()
        self.at_least(
            "1b. the set-based floor on the project's tables (foreign keys, indexes) vs on bare copies of them"
            f" (primary keys, the upserts' unique keys and the members' user_id index only), same data, batch by"
            f" batch in turn ({rounds})",
            rate(project),
            f"{rate(bare)} (bare tables)",
            project / bare,
            BARE_TABLES_BUDGET,
        )
        self.note("1. worker throughput of each round", shown)
        self.note("1. floor throughput of each round", ", ".join(rate(value) for value in floors))
        by_round = ", ".join(f"{rate(p)} vs {rate(b)} ({p / b:.2f}x)" for p, b in pairs)
        self.note("1b. project's vs bare tables, each round", by_round)
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

    def extras_cost(self) -> None:
        """What each of the product's indexes and constraints costs the set-based floor: the
        bare copies with that one added, each run alone as the bare copies are just before."""
        bare = self.bare_floor()
        for name, statement in pipeline_data.product_extras(self.conn):
            with_it = self.bare_floor(statement)
            self.note(f"1b. bare tables + {name}", rate(with_it), rate(bare), ratio(with_it / bare))

    def run_floor(self, *, set_based: bool = False, prefix: str = "", paired: str = "") -> dict[str, Any]:
        argv = [sys.executable, str(PROJECT_DIR / "bench" / "pipeline_floor.py"), self.child_env["DATABASE_URL"]]
        argv += ["--batch-size", str(settings.SIGNAL_BATCH_SIZE)]
        argv += ["--set-based"] if set_based else []
        argv += ["--prefix", prefix] if prefix else []
        argv += ["--paired", paired] if paired else []
        return json_answer(
            self.children, self.children.start("floor", argv, env=self.child_env, cwd=PROJECT_DIR), 3_600
        )

    # --- budget 2: the gate's and the fence's share of a batch ------------------------------

    def gate_share(self) -> None:
        opts = self.options
        size = settings.SIGNAL_BATCH_SIZE
        count = len(self.data.signals)
        timed = min(opts.profile_batches, count // size - opts.cprofile_batches - 1)
        progress(
            f"signals_process in this process: 1 warm-up + {timed} timed + {opts.cprofile_batches} profiled batches"
        )
        # Every signal received at the current clock version; then, after the worker warmed,
        # leaves and rejoins of users without signals here: every signal's fence window holds
        # changes, so the while-queued check runs for each (from the feed, in memory), and
        # the outcomes stay those the data says.
        fence = LeaveClock.objects.get().version
        pipeline_data.load_pending(self.conn, self.data, fence=fence)
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
                probe.batch(ids)
        self.check(probe.processed == timed * size, f"the timed batches processed {timed * size:,} signals")

        self.check(probe.steps > 0, "signals_process ran the two gated steps (timed by the probe)")
        profiler = cProfile.Profile()
        profiler.enable()
        for ids in batches[timed + 1 : timed + 1 + opts.cprofile_batches]:
            signals_process(signal_ids=ids)
        profiler.disable()
        self.profile_text = top_functions(profiler, 18)

        total = probe.total
        share = (probe.gate + probe.steps) / total
        per_batch = total / timed
        self.share_below(
            f"2. gate() (fence) + the two gated steps, share of signals_process time, {timed} batches of {size}",
            f"{percent(share)} ({us((probe.gate + probe.steps) / timed)} of {ms(per_batch)} a batch)",
            share,
            GATE_SHARE_BUDGET,
        )
        with_queued = (probe.gate + probe.preload + probe.steps) / total
        self.share_below(
            f"2b. the same with the while-queued check ({WHILE_QUEUED_CHANGES} changes in every signal's"
            " window) and the evidence written",
            f"{percent(with_queued)} ({us((probe.gate + probe.preload + probe.steps) / timed)} a batch)",
            with_queued,
            WHILE_QUEUED_SHARE_BUDGET,
        )
        gate_line = "2. gate() per batch: the fence (one clock read), nothing changed"
        self.note(gate_line, us(probe.gate / timed), "", percent(probe.gate / total))
        self.note(
            "2. the two gated steps per batch (each: one call for the batch, a bitmap look-up a signal)",
            us(probe.steps / timed),
            "",
            percent(probe.steps / total),
        )
        in_process = probe.processed / total
        self.note("2. signals_process in this process, no Celery (time inside signals_process only)", rate(in_process))
        self.note("2. signals_process per batch, all of it", ms(per_batch), "", "100%")
        for phase, seconds in probe.breakdown().items():
            self.note(f"2. signals_process per batch: {phase}", us(seconds / timed), "", percent(seconds / total))
