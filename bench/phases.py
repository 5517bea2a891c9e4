"""The leave cache's budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: run.py owns the database and the settings.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import tools
from bench.common import progress
from bench.report import Results, Row, mib, ms, ns, ratio, us
from community.cache import leave_cache, leave_gate
from community.cache.gate import LeaveGate
from community.membership import MembershipStatus
from community.models import ChangeSource, CommunityLeave, LeaveClock
from community.services.layer import bulk_leave_community_layer

TABLE = CommunityLeave._meta.db_table
# psycopg's fetch of the same ids the gate holds (the records that are not ACTIVE).
FLOOR_WARM_SQL = f"SELECT user_id FROM {TABLE} WHERE NOT (octet_length(value) = 9 AND get_byte(value, 0) = 0)"
FLOOR_FENCE_SQL = f"SELECT version, generation FROM {LeaveClock._meta.db_table} WHERE id = %s"

GATE_CHECK_BUDGET = 2.0
WARM_BUDGET = 1.5
DENSE_BYTES_BUDGET = 4  # per gated user, ids from 1 to 10x the records
SPARSE_BYTES_BUDGET = 16  # per gated user, ids from 1 to SPARSE_SPACE
SPARSE_SPACE = 2**32  # the whole 32-bit id space: one gated user in ~4,300 ids at 1,000,000
FENCE_QUERIES_BUDGET = 1
LEAVE_CHUNK = 1_000


@dataclass(frozen=True)
class Options:
    records: int
    active_share: float
    warm_rounds: int
    lookup_rounds: int
    probes: int
    fence_rounds: int
    fence_calls: int
    sync_steps: tuple[int, ...]
    sync_rounds: int
    seed: int
    scale_records: int = 0  # an extra warm of this many gated users, for time and memory only


def gate() -> LeaveGate:
    return leave_gate()


def cold_gate() -> LeaveGate:
    """Forget the cache, then sync: a full warm from the records."""
    leave_cache.reset()
    return gate()


def in_fresh_process(what: str) -> dict[str, Any]:
    """What bench/rss_child.py measures in a fresh process ("warm", "floor", "retained")."""
    child = Path(__file__).with_name("rss_child.py")
    done = subprocess.run([sys.executable, str(child), what], check=True, capture_output=True, text=True)
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def rss_in_fresh_process(what: str) -> int | None:
    """Peak resident memory rise of one warm ("warm") or one floor fetchall ("floor"), in bytes."""
    peak: int | None = in_fresh_process(what)["peak"]
    return peak


def is_gated(value: bytes) -> bool:
    """The gate's rule for one stored record, from the bytes the benchmark wrote."""
    return value[0] != MembershipStatus.ACTIVE


@dataclass
class Bench(Results):
    conn: psycopg.Connection[Any]
    options: Options

    def run(self) -> None:
        opts = self.options
        small = tools.leave_records(10, active_share=opts.active_share, seed=opts.seed + 1)
        self.load(small)
        self.fence(len(small))
        self.truncate()

        progress(f"making and loading {opts.records:,} records ({opts.active_share:.0%} ACTIVE)")
        records = tools.leave_records(opts.records, active_share=opts.active_share, seed=opts.seed)
        label = f"{opts.active_share:.0%} ACTIVE"
        self.load(records, label)
        self.warm(records, label, budget=True)
        self.fence(len(records))
        self.gate_check(records)
        self.syncs({user_id for user_id, _ in records})

        progress(f"reloading the same {opts.records:,} ids, all LEFT")
        all_left = tools.leave_records(opts.records, active_share=0.0, seed=opts.seed)
        del records
        self.truncate()
        self.load(all_left, "all LEFT")
        self.warm(all_left, "all LEFT", budget=False)
        del all_left

        progress(f"sparse ids: {opts.records:,} records drawn from 1..2^32")
        sparse = tools.leave_records(opts.records, active_share=opts.active_share, seed=opts.seed, space=SPARSE_SPACE)
        self.truncate()
        sparse_label = f"{opts.active_share:.0%} ACTIVE, sparse ids (1..2^32)"
        self.load(sparse, sparse_label)
        self.warm(sparse, sparse_label, budget=True, memory_budget=SPARSE_BYTES_BUDGET)
        del sparse
        if opts.scale_records:
            self.scale(opts.scale_records)

        self.sort()

    # --- data --------------------------------------------------------------------------

    def load(self, records: Sequence[tuple[int, bytes]], label: str = "") -> None:
        started = time.perf_counter()
        tools.copy_records(self.conn, TABLE, records)
        if label:
            elapsed = ms(time.perf_counter() - started)
            self.note(f"0. load {len(records):,} records, {label} (COPY BINARY + VACUUM ANALYZE)", elapsed)

    def truncate(self) -> None:
        self.conn.execute(f"TRUNCATE {TABLE}")

    def floor_fetch(self) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cursor:
            cursor.execute(FLOOR_WARM_SQL)
            return cursor.fetchall()

    # --- budget 2: warming ---------------------------------------------------------------

    def warm(
        self, records: Sequence[tuple[int, bytes]], label: str, *, budget: bool, memory_budget: int = DENSE_BYTES_BUDGET
    ) -> None:
        opts = self.options
        count = len(records)
        progress(f"warm vs floor, {count:,} records, {label}: {opts.warm_rounds} rounds")
        cases = {
            "floor": tools.Case(run=self.floor_fetch),
            "warm": tools.Case(run=gate, prepare=leave_cache.reset),
        }
        tools.time_rounds(cases, 1)  # untimed: first use of each path
        timing = tools.time_rounds(cases, opts.warm_rounds)
        floor, warm = timing["floor"].median, timing["warm"].median
        (self.budgets if budget else self.info).append(
            Row(
                f"2a. warm from {count:,} records, {label} (median of {opts.warm_rounds})",
                f"{ms(warm)} (best {ms(timing['warm'].best)})",
                f"{ms(floor)} (best {ms(timing['floor'].best)})",
                ratio(warm / floor),
                f"≤ {WARM_BUDGET:g}x",
                warm / floor <= WARM_BUDGET if budget else None,
            ),
        )

        expected = {user_id for user_id, value in records if is_gated(value)}
        warmed = cold_gate()
        self.check(
            leave_cache.size == len(expected)
            and all(warmed.is_left(user_id) == (user_id in expected) for user_id, _ in records),
            f"the warmed cache gates exactly the LEFT records ({label})",
        )
        del warmed

        progress(f"memory of the warm, {label}")
        held_gate, use = tools.traced(gate)
        del held_gate
        retained = in_fresh_process("retained")
        held = retained["held"]
        per_user = retained["retained"] / held
        set_floor = tools.set_floor_bytes(expected)
        self.budget(
            f"2b. memory a warmed process keeps per gated user, {label} ({held:,} held; resident set"
            " after malloc_trim, fresh process)",
            f"{per_user:.1f} B ({mib(retained['retained'])})",
            f"{set_floor / held:.1f} B (a Python set of the same ids)",
            ratio(retained["retained"] / set_floor),
            f"≤ {memory_budget} B/user",
            per_user <= memory_budget,
        )
        floor_rows, floor_use = tools.traced(self.floor_fetch)
        del floor_rows
        self.note(
            f"2b. peak Python memory during warm (tracemalloc), {label}",
            f"{mib(use.peak)} ({use.peak / held:.0f} B/held)",
            f"{mib(floor_use.peak)} (fetchall)",
            ratio(use.peak / floor_use.peak),
        )
        warm_rss, floor_rss = rss_in_fresh_process("warm"), rss_in_fresh_process("floor")
        self.note(
            f"2b. peak resident memory rise during warm, fresh process (VmHWM), {label}",
            f"{mib(warm_rss)} ({warm_rss / held:.0f} B/held)" if warm_rss else "n/a",
            f"{mib(floor_rss)} (fetchall)" if floor_rss else "n/a",
            ratio(warm_rss / floor_rss) if warm_rss and floor_rss else "",
        )

    # --- at scale: many gated users, time and memory only ---------------------------------

    def scale(self, count: int) -> None:
        """``count`` gated users (ids 1..10x``count``, every 10th), made by the database; one
        warm in a fresh process: its time, what the process keeps, and the machine's total
        for the default process counts (gunicorn's 2 x CPUs + 1 web workers, one worker unit
        of 2 Celery children: each holds its own gate)."""
        progress(f"at scale: {count:,} gated users, made in SQL")
        self.truncate()
        with self.conn.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TABLE} (user_id, value) "
                "SELECT n * 10, '\\x01'::bytea || int8send(n) FROM generate_series(1, %s) n",
                [count],
            )
            cursor.execute(f"VACUUM ANALYZE {TABLE}")
        retained = in_fresh_process("retained")
        floor_started = time.perf_counter()
        rows = self.floor_fetch()
        floor = time.perf_counter() - floor_started
        del rows
        processes = (os.cpu_count() or 1) * 2 + 1 + 2
        per_user = retained["retained"] / retained["held"]
        self.note(
            f"4. warm of {retained['held']:,} gated users in a fresh process",
            f"{retained['seconds']:.2f} s",
            f"{floor:.2f} s (psycopg fetchall of the same ids)",
            ratio(retained["seconds"] / floor),
        )
        self.note(
            f"4. memory a process keeps for {retained['held']:,} gated users; its whole resident set",
            f"{mib(retained['retained'])} ({per_user:.1f} B/user); {mib(retained['rss'])}",
            f"{mib(retained['held'] * 65)} (a Python set, ~65 B/user)",
        )
        self.note(
            f"4. the machine's total, {processes} processes with a gate ({processes - 2} web, 2 worker children)",
            f"{mib(retained['retained'] * processes)}",
            f"{mib(retained['held'] * 65 * processes)} (with Python sets)",
        )
        self.truncate()

    # --- budget 3: the fence -------------------------------------------------------------

    def fence(self, count: int) -> None:
        opts = self.options
        progress(f"fence, nothing changed, {count:,} records")
        cache = leave_cache
        cold_gate()
        warms = cache.warms
        with CaptureQueriesContext(connection) as captured:
            gate()
        queries = len(captured.captured_queries)
        self.budget(
            f"3. fence, nothing changed, {count:,} records: queries per gate()",
            str(queries),
            "",
            "",
            f"exactly {FENCE_QUERIES_BUDGET}",
            queries == FENCE_QUERIES_BUDGET,
        )
        with self.conn.cursor() as cursor:
            namespace = {"gate": gate, "cursor": cursor, "sql": FLOOR_FENCE_SQL, "pk": (1,)}
            timing = tools.statement_rounds(
                {"floor": "cursor.execute(sql, pk); cursor.fetchone()", "gate": "gate()"},
                namespace,
                opts.fence_rounds,
                number=opts.fence_calls,
            )
        self.check(cache.warms == warms, f"no re-warm while timing the fence ({count:,} records)")
        floor, fenced = timing["floor"].median, timing["gate"].median
        self.note(
            f"3. fence time per gate(), nothing changed, {count:,} records",
            us(fenced),
            f"{us(floor)} (psycopg, same row)",
            ratio(fenced / floor),
        )

    # --- budget 1: the look-up -----------------------------------------------------------

    def gate_check(self, records: Sequence[tuple[int, bytes]]) -> None:
        opts = self.options
        progress(f"gate look-ups vs dict, {opts.probes:,} probes, {opts.lookup_rounds} rounds")
        stored = dict(records)
        probes = tools.probe_ids(
            [user_id for user_id, _ in records], opts.probes, space=tools.ID_SPACE * len(records), seed=opts.seed + 2
        )
        warmed = gate()
        with CaptureQueriesContext(connection) as captured:
            answers = [warmed.is_left(user_id) for user_id in probes]
        self.check(not captured.captured_queries, "gate.is_left() runs no query")
        self.check(
            answers == [user_id in stored and is_gated(stored[user_id]) for user_id in probes],
            "gate.is_left() answers as the records say",
        )
        timing = tools.statement_rounds(
            {
                "loop": "for user_id in probes: pass",
                "dict": "for user_id in probes: user_id in d",
                "gate": "for user_id in probes: gate.is_left(user_id)",
            },
            {"probes": probes, "d": stored, "gate": warmed},
            opts.lookup_rounds,
        )
        loop, floor, looked_up = (timing[name].median / len(probes) for name in ("loop", "dict", "gate"))
        self.budget(
            f"1. gate.is_left(user_id) per look-up, {len(records):,} records (median of {opts.lookup_rounds})",
            ns(looked_up),
            f"{ns(floor)} (`user_id in d`, dict of {len(stored):,})",
            ratio(looked_up / floor),
            f"≤ {GATE_CHECK_BUDGET:g}x",
            looked_up / floor <= GATE_CHECK_BUDGET,
        )
        self.note(
            "1. gate.is_left(user_id) per look-up, net of the loop's own cost",
            ns(looked_up - loop),
            ns(floor - loop),
            ratio((looked_up - loop) / (floor - loop)),
        )
        self.note("1. the `for user_id in probes: pass` loop itself, per probe", ns(loop))

    # --- for information: a sync after changes ---------------------------------------------

    def syncs(self, present: set[int]) -> None:
        opts = self.options
        rng = random.Random(opts.seed + 3)
        space = tools.ID_SPACE * opts.records
        cache = leave_cache
        # Untimed: the first write after the load pays one-off costs (about 80 ms here).
        first = tools.absent_ids(present, LEAVE_CHUNK, space=space, rng=rng)
        present.update(first)
        bulk_leave_community_layer(user_ids=first, source=ChangeSource.COMMAND)
        for count in opts.sync_steps:
            leaves = f"{count:,} leave{'' if count == 1 else 's'}"
            progress(f"sync after {leaves}, {opts.sync_rounds} rounds")
            writes: list[float] = []
            syncs: list[float] = []
            queries: set[int] = set()
            for _ in range(opts.sync_rounds):
                user_ids = tools.absent_ids(present, count, space=space, rng=rng)
                present.update(user_ids)
                gate()
                warms, fed = cache.warms, cache.feed_rows
                started = time.perf_counter()
                for start in range(0, count, LEAVE_CHUNK):
                    chunk = user_ids[start : start + LEAVE_CHUNK]
                    bulk_leave_community_layer(user_ids=chunk, source=ChangeSource.COMMAND)
                writes.append(time.perf_counter() - started)
                with CaptureQueriesContext(connection) as captured:
                    started = time.perf_counter()
                    synced = gate()
                    syncs.append(time.perf_counter() - started)
                queries.add(len(captured.captured_queries))
                self.check(
                    cache.warms == warms and cache.feed_rows - fed == count,
                    f"a sync after {leaves} replays the feed, no re-warm",
                )
                self.check(
                    all(synced.is_left(user_id) for user_id in user_ids),
                    f"every leaver gated after the sync after {leaves}",
                )
            median_sync, median_write = statistics.median(syncs), statistics.median(writes)
            self.note(
                f"3. sync after {leaves}: one gate() (median of {opts.sync_rounds})",
                f"{ms(median_sync)}, {'/'.join(map(str, sorted(queries)))} queries",
            )
            self.note(
                f"3. {leaves} made by bulk_leave_community_layer, chunks of {LEAVE_CHUNK:,}",
                f"{ms(median_write)} ({us(median_write / count)} per leave)",
            )
