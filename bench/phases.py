"""The leave cache's budgets, each measured against a floor taken in the same run (BENCHMARKS.md).
Imported only after ``django.setup()``: run.py owns the database and the settings."""

from __future__ import annotations

import argparse
import array
import ctypes
import gc
import multiprocessing
import os
import random
import statistics
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
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
from community.membership import CommunityMembership, MembershipStatus, serialize_membership
from community.models import ChangeSource, CommunityLeave, LeaveClock
from community.services.layer import bulk_leave_community_layer

TABLE = CommunityLeave._meta.db_table
# psycopg's fetch of the same ids the gate holds (the records that are not ACTIVE).
FLOOR_WARM_SQL = f"SELECT user_id FROM {TABLE} WHERE NOT (octet_length(value) = 9 AND get_byte(value, 0) = 0)"
FLOOR_FENCE_SQL = f"SELECT version, generation FROM {LeaveClock._meta.db_table} WHERE id = %s"

GATE_CHECK_BUDGET = 2.0
WARM_BUDGET = 1.5
DENSE_BYTES_BUDGET = 4  # per gated user, ids from 1 to ID_SPACE times the records
SPARSE_BYTES_BUDGET = 16  # per gated user, ids from 1 to SPARSE_SPACE
FENCE_QUERIES_BUDGET = 1
ID_SPACE = 10  # dense ids: the leavers are a sparse subset of 10 times as many users
SPARSE_SPACE = 2**32  # the whole 32-bit id space: one gated user in ~4,300 ids at 1,000,000
ACTIVE_SHARE = 0.10
PROBES = 200_000
SYNC_STEPS = (1, 100, 10_000)
LEAVE_CHUNK = 1_000
SCALE = 10_000_000  # gated users of the warm at scale, skipped with --quick
# Rounds of each measurement, and the fence's calls a round: (with --quick, without).
ROUNDS = {"warm": (3, 7), "lookup": (10, 31), "fence": (3, 7), "fence_calls": (300, 1_000), "sync": (1, 3)}


def new_ids(taken: set[int], count: int, space: int, rng: random.Random) -> list[int]:
    """``count`` distinct ids from 1..space that are not in ``taken``; they join it."""
    chosen: list[int] = []
    while len(chosen) < count:
        candidate = rng.randint(1, space)
        if candidate not in taken:
            taken.add(candidate)
            chosen.append(candidate)
    return chosen


def timed(run: Callable[[], object]) -> float:
    """Seconds of ``run()``, started with the garbage collected (it stays on, as in production);
    what it returns is freed after the clock stops."""
    gc.collect()
    started = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - started
    del result
    return seconds


def statement_medians(statements: Sequence[str], namespace: dict[str, Any], rounds: int, calls: int = 1) -> list[float]:
    """The median seconds a call of each statement, timeit ``calls`` times a round, alternating them."""
    timers = [timeit.Timer(statement, globals=namespace) for statement in statements]
    samples: list[list[float]] = [[] for _ in timers]
    for _ in range(rounds):
        for timer, times in zip(timers, samples, strict=True):
            times.append(timer.timeit(number=calls) / calls)
    return [statistics.median(times) for times in samples]


def set_floor_bytes(ids: Iterable[int]) -> int:
    """What a bare Python set of these ids holds (tracemalloc): its table plus one int per id.
    The ids are read back out of an array so that the set owns freshly made ints, as the cache
    does when it builds its set from the rows it fetched."""
    packed = array.array("q", ids)
    gc.collect()
    tracemalloc.start()
    made = set(packed)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del made
    return held


def in_fresh_process(measure: Callable[[], Any]) -> Any:
    """``measure`` (a function of this module) in a new interpreter, spawned rather than forked
    so that it has no freed memory of this one's to reuse; Django is set up there first."""
    with multiprocessing.get_context("spawn").Pool(1, initializer=django.setup) as pool:
        return pool.apply(measure)


def peak_rise(fn: Callable[[], object]) -> tuple[float, int]:
    """Seconds of ``fn`` (started collected) and how far the resident set rose above its start meanwhile,
    libpq's result buffer included (Linux: 5 in /proc/self/clear_refs resets the high-water mark)."""
    Path("/proc/self/clear_refs").write_text("5")
    before = tools.status_kib("VmRSS")
    seconds = timed(fn)
    return seconds, (tools.status_kib("VmHWM") - before) * 1024


def settled_rss() -> int:
    """The resident set once the garbage collector and glibc's malloc_trim have given back what was freed."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return tools.status_kib("VmRSS") * 1024


def warm_in_child() -> dict[str, Any]:
    """A fresh process's first warm: its time and peak. That warm also sets up what a process
    keeps anyway (modules, compiled queries, the connection's buffers), so what a second warm
    keeps, the gate dropped between, is the gate's own memory (the bitmap, unseen by tracemalloc)."""
    LeaveClock.objects.get(pk=1)  # connect first: the connection is not the warm's cost
    seconds, peak = peak_rise(leave_gate)
    leave_cache.reset()
    before = settled_rss()
    leave_gate()
    rss = settled_rss()
    return {"seconds": seconds, "peak": peak, "retained": rss - before, "held": leave_cache.size, "rss": rss}


def floor_in_child() -> int:
    """The resident-set peak of the floor's fetchall in a fresh process."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        return peak_rise(lambda: conn.execute(FLOOR_WARM_SQL).fetchall())[1]


def leave(user_ids: Sequence[int]) -> None:
    for start in range(0, len(user_ids), LEAVE_CHUNK):
        bulk_leave_community_layer(user_ids=user_ids[start : start + LEAVE_CHUNK], source=ChangeSource.COMMAND)


@dataclass
class Bench(Results):
    conn: psycopg.Connection[Any]
    args: argparse.Namespace  # run.py's options

    def rounds(self, name: str) -> int:
        return ROUNDS[name][0 if self.args.quick else 1]

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
        if not self.args.quick:
            self.scale()
        self.sort()

    def load(self, count: int, share: float, space: int | None = None) -> list[tuple[int, bytes]]:
        """The table emptied, then ``count`` records (user_id, 9-byte value) in random id order, ``share``
        of them ACTIVE (users who left and rejoined: they keep their ``left_at_ns``), ids drawn from
        1..``space`` (default ``ID_SPACE`` times ``count``); returns them."""
        progress(f"making and loading {count:,} records")
        ids = random.Random(self.args.seed).sample(range(1, (space or ID_SPACE * count) + 1), count)
        active = round(count * share)
        records = []
        for index, user_id in enumerate(ids):
            status = MembershipStatus.ACTIVE if index < active else MembershipStatus.LEFT
            left_at_ns = tools.LEFT_AT_BASE_NS + index * 10**9
            records.append((user_id, serialize_membership(CommunityMembership(user_id, status, left_at_ns))))
        self.conn.execute(f"TRUNCATE {TABLE}")
        tools.copy_records(self.conn, TABLE, records)
        return records

    def floor_fetch(self) -> list[tuple[Any, ...]]:
        return self.conn.execute(FLOOR_WARM_SQL).fetchall()

    def warm(
        self, share: float, label: str, memory_budget: int, *, space: int | None = None, time_budget: bool = True
    ) -> list[tuple[int, bytes]]:
        """Budgets 2a and 2b on freshly loaded records: the warm's time and memory; returns the records."""
        records = self.load(self.args.records, share, space)
        rounds = self.rounds("warm")
        progress(f"warm vs floor, {len(records):,} records, {label}: {rounds} rounds")
        floor_times: list[float] = []
        warm_times: list[float] = []
        for _ in range(rounds + 1):  # alternating, so that drift hits both alike
            floor_times.append(timed(self.floor_fetch))
            leave_cache.reset()
            warm_times.append(timed(leave_gate))
        del floor_times[0], warm_times[0]  # the first round is untimed: the first use of each path
        floor, warm = statistics.median(floor_times), statistics.median(warm_times)
        row = (
            f"2a. warm from {len(records):,} records, {label} (median of {rounds})",
            f"{ms(warm)} (best {ms(min(warm_times))})",
            f"{ms(floor)} (best {ms(min(floor_times))})",
            ratio(warm / floor),
        )
        if time_budget:
            self.budget(*row, f"≤ {WARM_BUDGET:g}x", warm / floor <= WARM_BUDGET)
        else:
            self.note(*row)

        expected = {user_id for user_id, value in records if value[0] != MembershipStatus.ACTIVE}
        warmed = leave_gate()
        self.check(
            leave_cache.size == len(expected)
            and all(warmed.is_left(user_id) == (user_id in expected) for user_id, _ in records),
            f"the warmed cache gates exactly the LEFT records ({label})",
        )

        progress(f"memory of the warm, {label}")
        child = in_fresh_process(warm_in_child)
        held, retained = child["held"], child["retained"]
        set_floor = set_floor_bytes(expected)
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

    def scale(self) -> None:
        """For information: SCALE gated users (every 10th id), made by the database; one warm in a
        fresh process: its time, what the process keeps, and the machine's total for the default
        process counts (gunicorn's 2 x CPUs + 1 web workers, one worker unit of 2 Celery children:
        each holds its own gate)."""
        progress(f"at scale: {SCALE:,} gated users, made in SQL")
        self.conn.execute(f"TRUNCATE {TABLE}")
        self.conn.execute(
            f"INSERT INTO {TABLE} (user_id, value) "
            "SELECT n * 10, '\\x01'::bytea || int8send(n) FROM generate_series(1, %s) n",
            [SCALE],
        )
        self.conn.execute(f"VACUUM ANALYZE {TABLE}")
        child = in_fresh_process(warm_in_child)
        floor = timed(self.floor_fetch)
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
            floor, fenced = statement_medians(
                ("cursor.execute(sql, pk); cursor.fetchone()", "gate()"),
                {"gate": leave_gate, "cursor": cursor, "sql": FLOOR_FENCE_SQL, "pk": (1,)},
                self.rounds("fence"),
                calls=self.rounds("fence_calls"),
            )
        self.check(leave_cache.warms == warms, f"no re-warm while timing the fence ({count:,} records)")
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
        # Half ids with a record, half without, shuffled. Each probe is a new int object, as an id
        # read from a signal would be: the very object stored in the dict would match by identity
        # and flatter the floor.
        rng = random.Random(self.args.seed + 2)
        hits = rng.choices(list(stored), k=PROBES // 2)
        probes = hits + new_ids(set(stored), PROBES - len(hits), ID_SPACE * len(records), rng)
        rng.shuffle(probes)
        probes = array.array("q", probes).tolist()
        warmed = leave_gate()
        with CaptureQueriesContext(connection) as queries:
            answers = [warmed.is_left(user_id) for user_id in probes]
        self.check(not queries.captured_queries, "gate.is_left() runs no query")
        self.check(
            answers == [user_id in stored and stored[user_id][0] != MembershipStatus.ACTIVE for user_id in probes],
            "gate.is_left() answers as the records say",
        )
        medians = statement_medians(
            (
                "for user_id in probes: pass",
                "for user_id in probes: user_id in d",
                "for user_id in probes: gate.is_left(user_id)",
            ),
            {"probes": probes, "d": stored, "gate": warmed},
            rounds,
        )
        loop, floor, looked_up = (seconds / len(probes) for seconds in medians)
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
        """For information: one gate() after leaves made through the product, replayed from the change feed."""
        rounds = self.rounds("sync")
        rng = random.Random(self.args.seed + 3)
        space = ID_SPACE * self.args.records
        # Untimed: the first write after the load pays one-off costs (about 80 ms here).
        leave(new_ids(present, LEAVE_CHUNK, space, rng))
        for count in SYNC_STEPS:
            leaves = f"{count:,} leave{'' if count == 1 else 's'}"
            progress(f"sync after {leaves}, {rounds} rounds")
            syncs: list[float] = []
            queries: set[int] = set()
            for _ in range(rounds):
                user_ids = new_ids(present, count, space, rng)
                leave_gate()
                warms, fed = leave_cache.warms, leave_cache.feed_rows
                leave(user_ids)
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
            self.note(
                f"3. sync after {leaves}: one gate() (median of {rounds})",
                f"{ms(statistics.median(syncs))}, {'/'.join(map(str, sorted(queries)))} queries",
            )
