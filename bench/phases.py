"""The leave cache's budgets, each measured against a floor taken in the same run.

Imported only after ``django.setup()``: run.py owns the database and the settings.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import psycopg
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import tools
from bench.common import progress
from bench.report import Results, mib, ms, ns, ratio, us
from community.cache import leave_cache, leave_gate
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
ACTIVE_SHARE = 0.10
PROBES = 200_000
SYNC_STEPS = (1, 100, 10_000)
LEAVE_CHUNK = 1_000
# Rounds of each measurement, and the fence's calls a round: (with --quick, without).
ROUNDS = {"warm": (3, 7), "lookup": (10, 31), "fence": (3, 7), "fence_calls": (300, 1_000), "sync": (1, 3)}


def is_gated(value: bytes) -> bool:
    """The gate's rule for one stored record, from the bytes the benchmark wrote."""
    return value[0] != MembershipStatus.ACTIVE


def in_fresh_process(measure: Callable[[], Any]) -> Any:
    """``measure`` (a function of this module) in a new interpreter, spawned rather than forked
    so that it has no freed memory of this one's to reuse; Django is set up there first."""
    with multiprocessing.get_context("spawn").Pool(1, initializer=django.setup) as pool:
        return pool.apply(measure)


def _peak_rise(fn: Callable[[], object]) -> tuple[float, int]:
    """Seconds of ``fn`` and how far the resident set rose above its start meanwhile, libpq's
    result buffer included (Linux: 5 in /proc/self/clear_refs resets the high-water mark)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = tools.status_kib("VmRSS")
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    return seconds, (tools.status_kib("VmHWM") - before) * 1024


def _settled_rss() -> int:
    """The resident set once the garbage collector and glibc's malloc_trim have given back what was freed."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return tools.status_kib("VmRSS") * 1024


def warm_in_child() -> dict[str, Any]:
    """A fresh process's first warm: its time and peak. That warm also sets up what a process
    keeps anyway (modules, compiled queries, the connection's buffers), so what a second warm
    keeps, the gate dropped between, is the gate's own memory (the bitmap, unseen by tracemalloc)."""
    LeaveClock.objects.get(pk=1)  # connect first: the connection is not the warm's cost
    seconds, peak = _peak_rise(leave_gate)
    leave_cache.reset()
    before = _settled_rss()
    leave_gate()
    retained = _settled_rss() - before
    rss = tools.status_kib("VmRSS") * 1024
    return {"seconds": seconds, "peak": peak, "retained": retained, "held": leave_cache.size, "rss": rss}


def floor_in_child() -> int:
    """The resident-set peak of the floor's fetchall in a fresh process."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        return _peak_rise(lambda: conn.execute(FLOOR_WARM_SQL).fetchall())[1]


def leave(user_ids: Sequence[int]) -> None:
    for start in range(0, len(user_ids), LEAVE_CHUNK):
        bulk_leave_community_layer(user_ids=user_ids[start : start + LEAVE_CHUNK], source=ChangeSource.COMMAND)


@dataclass
class Bench(Results):
    conn: psycopg.Connection[Any]
    args: argparse.Namespace  # run.py's options

    def rounds(self, name: str) -> int:
        quick, full = ROUNDS[name]
        return quick if self.args.quick else full

    def run(self) -> None:
        self.load(10, ACTIVE_SHARE)
        self.fence(10)
        dense = f"{ACTIVE_SHARE:.0%} ACTIVE"
        records = self.warm(ACTIVE_SHARE, dense, DENSE_BYTES_BUDGET)
        self.fence(len(records))
        self.gate_check(records)
        self.syncs({user_id for user_id, _ in records})
        self.warm(0.0, "all LEFT", DENSE_BYTES_BUDGET, time_budget=False)  # the same ids; its time for information
        self.warm(ACTIVE_SHARE, f"{dense}, sparse ids (1..2^32)", SPARSE_BYTES_BUDGET, space=SPARSE_SPACE)
        if self.args.scale:
            self.scale(self.args.scale)
        self.sort()

    def load(self, count: int, share: float, label: str = "", space: int | None = None) -> list[tuple[int, bytes]]:
        """The table emptied, then ``count`` records of tools.leave_records; with a ``label``, the load's time noted."""
        progress(f"making and loading {count:,} records {label}")
        records = tools.leave_records(count, active_share=share, seed=self.args.seed, space=space)
        self.conn.execute(f"TRUNCATE {TABLE}")
        started = time.perf_counter()
        tools.copy_records(self.conn, TABLE, records)
        if label:
            self.note(
                f"0. load {count:,} records, {label} (COPY BINARY + VACUUM ANALYZE)", ms(time.perf_counter() - started)
            )
        return records

    def floor_fetch(self) -> list[tuple[Any, ...]]:
        return self.conn.execute(FLOOR_WARM_SQL).fetchall()

    def warm(
        self, share: float, label: str, memory_budget: int, *, space: int | None = None, time_budget: bool = True
    ) -> list[tuple[int, bytes]]:
        """Budget 2: load the records, then measure their warm's time and memory; returns the records."""
        records = self.load(self.args.records, share, label, space)
        rounds = self.rounds("warm")
        progress(f"warm vs floor, {len(records):,} records, {label}: {rounds} rounds")
        cases = {"floor": (lambda: None, self.floor_fetch), "warm": (leave_cache.reset, leave_gate)}
        tools.time_rounds(cases, 1)  # untimed: first use of each path
        timing = tools.time_rounds(cases, rounds)
        floor, warm = (statistics.median(timing[name]) for name in cases)
        row = (
            f"2a. warm from {len(records):,} records, {label} (median of {rounds})",
            f"{ms(warm)} (best {ms(min(timing['warm']))})",
            f"{ms(floor)} (best {ms(min(timing['floor']))})",
            ratio(warm / floor),
        )
        if time_budget:
            self.budget(*row, f"≤ {WARM_BUDGET:g}x", warm / floor <= WARM_BUDGET)
        else:
            self.note(*row)

        expected = {user_id for user_id, value in records if is_gated(value)}
        leave_cache.reset()
        warmed = leave_gate()
        self.check(
            leave_cache.size == len(expected)
            and all(warmed.is_left(user_id) == (user_id in expected) for user_id, _ in records),
            f"the warmed cache gates exactly the LEFT records ({label})",
        )

        progress(f"memory of the warm, {label}")
        child = in_fresh_process(warm_in_child)
        held, retained = child["held"], child["retained"]
        set_floor = tools.set_floor_bytes(expected)
        self.budget(
            f"2b. memory a warmed process keeps per gated user, {label} ({held:,} held; resident set"
            " after malloc_trim, fresh process)",
            f"{retained / held:.1f} B ({mib(retained)})",
            f"{set_floor / held:.1f} B (a Python set of the same ids)",
            ratio(retained / set_floor),
            f"≤ {memory_budget} B/user",
            retained / held <= memory_budget,
        )
        floor_peak = in_fresh_process(floor_in_child)
        self.note(
            f"2b. peak resident memory rise during warm, fresh process (VmHWM), {label}",
            f"{mib(child['peak'])} ({child['peak'] / held:.0f} B/held)",
            f"{mib(floor_peak)} (fetchall)",
            ratio(child["peak"] / floor_peak),
        )
        return records

    def scale(self, count: int) -> None:
        """For information: ``count`` gated users (ids 1..10x``count``, every 10th), made by the
        database; one warm in a fresh process: its time, what the process keeps, and the machine's
        total for the default process counts (gunicorn's 2 x CPUs + 1 web workers, one worker unit
        of 2 Celery children: each holds its own gate)."""
        progress(f"at scale: {count:,} gated users, made in SQL")
        self.conn.execute(f"TRUNCATE {TABLE}")
        self.conn.execute(
            f"INSERT INTO {TABLE} (user_id, value) "
            "SELECT n * 10, '\\x01'::bytea || int8send(n) FROM generate_series(1, %s) n",
            [count],
        )
        self.conn.execute(f"VACUUM ANALYZE {TABLE}")
        child = in_fresh_process(warm_in_child)
        floor = tools.time_rounds({"floor": (lambda: None, self.floor_fetch)}, 1)["floor"][0]
        held, retained = child["held"], child["retained"]
        processes = (os.cpu_count() or 1) * 2 + 1 + 2
        self.note(
            f"4. warm of {held:,} gated users in a fresh process",
            f"{child['seconds']:.2f} s",
            f"{floor:.2f} s (psycopg fetchall of the same ids)",
            ratio(child["seconds"] / floor),
        )
        self.note(
            f"4. memory a process keeps for {held:,} gated users; its whole resident set",
            f"{mib(retained)} ({retained / held:.1f} B/user); {mib(child['rss'])}",
            f"{mib(held * 65)} (a Python set, ~65 B/user)",
        )
        self.note(
            f"4. the machine's total, {processes} processes with a gate ({processes - 2} web, 2 worker children)",
            mib(retained * processes),
            f"{mib(held * 65 * processes)} (with Python sets)",
        )

    def fence(self, count: int) -> None:
        """Budget 3: the queries of a gate() with nothing changed; its time for information."""
        progress(f"fence, nothing changed, {count:,} records")
        leave_cache.reset()
        leave_gate()
        warms = leave_cache.warms
        with CaptureQueriesContext(connection) as queries:
            leave_gate()
        self.budget(
            f"3. fence, nothing changed, {count:,} records: queries per gate()",
            str(len(queries)),
            "",
            "",
            f"exactly {FENCE_QUERIES_BUDGET}",
            len(queries) == FENCE_QUERIES_BUDGET,
        )
        with self.conn.cursor() as cursor:
            timing = tools.statement_rounds(
                {"floor": "cursor.execute(sql, pk); cursor.fetchone()", "gate": "gate()"},
                {"gate": leave_gate, "cursor": cursor, "sql": FLOOR_FENCE_SQL, "pk": (1,)},
                self.rounds("fence"),
                number=self.rounds("fence_calls"),
            )
        self.check(leave_cache.warms == warms, f"no re-warm while timing the fence ({count:,} records)")
        floor, fenced = (statistics.median(timing[name]) for name in ("floor", "gate"))
        self.note(
            f"3. fence time per gate(), nothing changed, {count:,} records",
            us(fenced),
            f"{us(floor)} (psycopg, same row)",
            ratio(fenced / floor),
        )

    def gate_check(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Budget 1: gate.is_left() against a dict's look-up, same probes."""
        rounds = self.rounds("lookup")
        progress(f"gate look-ups vs dict, {PROBES:,} probes, {rounds} rounds")
        stored = dict(records)
        probes = tools.probe_ids(list(stored), PROBES, space=tools.ID_SPACE * len(records), seed=self.args.seed + 2)
        warmed = leave_gate()
        with CaptureQueriesContext(connection) as queries:
            answers = [warmed.is_left(user_id) for user_id in probes]
        self.check(not queries.captured_queries, "gate.is_left() runs no query")
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
            rounds,
        )
        loop, floor, looked_up = (statistics.median(timing[name]) / len(probes) for name in timing)
        self.budget(
            f"1. gate.is_left(user_id) per look-up, {len(records):,} records (median of {rounds})",
            ns(looked_up),
            f"{ns(floor)} (`user_id in d`, dict of {len(stored):,})",
            ratio(looked_up / floor),
            f"≤ {GATE_CHECK_BUDGET:g}x",
            looked_up / floor <= GATE_CHECK_BUDGET,
        )
        self.note(
            f"1. gate.is_left(user_id) per look-up, net of the `for user_id in probes: pass` loop's own {ns(loop)}",
            ns(looked_up - loop),
            ns(floor - loop),
            ratio((looked_up - loop) / (floor - loop)),
        )

    def syncs(self, present: set[int]) -> None:
        """For information: one gate() after leaves made through the product, from the change feed."""
        rounds = self.rounds("sync")
        rng = random.Random(self.args.seed + 3)
        space = tools.ID_SPACE * self.args.records
        # Untimed: the first write after the load pays one-off costs (about 80 ms here).
        first = tools.absent_ids(present, LEAVE_CHUNK, space=space, rng=rng)
        present.update(first)
        leave(first)
        for count in SYNC_STEPS:
            leaves = f"{count:,} leave{'' if count == 1 else 's'}"
            progress(f"sync after {leaves}, {rounds} rounds")
            writes: list[float] = []
            syncs: list[float] = []
            queries: set[int] = set()
            for _ in range(rounds):
                user_ids = tools.absent_ids(present, count, space=space, rng=rng)
                present.update(user_ids)
                leave_gate()
                warms, fed = leave_cache.warms, leave_cache.feed_rows
                started = time.perf_counter()
                leave(user_ids)
                writes.append(time.perf_counter() - started)
                with CaptureQueriesContext(connection) as captured:
                    started = time.perf_counter()
                    synced = leave_gate()
                    syncs.append(time.perf_counter() - started)
                queries.add(len(captured))
                self.check(
                    leave_cache.warms == warms and leave_cache.feed_rows - fed == count,
                    f"a sync after {leaves} replays the feed, no re-warm",
                )
                self.check(
                    all(synced.is_left(user_id) for user_id in user_ids),
                    f"every leaver gated after the sync after {leaves}",
                )
            write = statistics.median(writes)
            self.note(
                f"3. sync after {leaves}: one gate() (median of {rounds})",
                f"{ms(statistics.median(syncs))}, {'/'.join(map(str, sorted(queries)))} queries",
            )
            self.note(
                f"3. {leaves} made by bulk_leave_community_layer, chunks of {LEAVE_CHUNK:,}",
                f"{ms(write)} ({us(write / count)} per leave)",
            )
