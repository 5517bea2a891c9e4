"""Timing, memory and data helpers for the benchmarks: psycopg and the codec, no Django."""

from __future__ import annotations

import array
import gc
import random
import statistics
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from community.membership import CommunityMembership, MembershipStatus, serialize_membership

# Leavers are a sparse subset of all users: ids are drawn from ID_SPACE times as many ids.
ID_SPACE = 10
# Where left_at_ns starts: 2024-01-01T00:00:00Z, one record a second after it.
LEFT_AT_BASE_NS = 1_704_067_200 * 10**9


@dataclass(frozen=True)
class Timing:
    """Seconds taken by each round of one measurement."""

    samples: tuple[float, ...]

    @property
    def best(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass(frozen=True)
class Case:
    """One timed call: ``prepare`` runs untimed before each round (e.g. to empty a cache)."""

    run: Callable[[], object]
    prepare: Callable[[], object] = lambda: None


def time_rounds(cases: dict[str, Case], rounds: int) -> dict[str, Timing]:
    """Time every case once per round, alternating them so that drift hits all alike.

    The garbage collector stays on, as in production, but starts each round empty; what a
    call returns is dropped after the clock stops, so its deallocation is not timed.
    """
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            case.prepare()
            gc.collect()
            started = time.perf_counter()
            result = case.run()
            samples[name].append(time.perf_counter() - started)
            del result
    return {name: Timing(tuple(values)) for name, values in samples.items()}


def statement_rounds(
    statements: dict[str, str], namespace: dict[str, Any], rounds: int, number: int = 1
) -> dict[str, Timing]:
    """timeit each statement ``number`` times per round, alternating them round by round."""
    timers = {name: timeit.Timer(statement, globals=namespace) for name, statement in statements.items()}
    samples: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number=number) / number)
    return {name: Timing(tuple(values)) for name, values in samples.items()}


@dataclass(frozen=True)
class MemoryUse:
    """Bytes allocated by Python during a call: still held after it, and at the highest point."""

    retained: int
    peak: int


def traced(fn: Callable[[], object]) -> tuple[object, MemoryUse]:
    """Run ``fn`` under tracemalloc and return its result and the memory it allocated.

    tracemalloc sees the Python allocators only: libpq's result buffer is not in these
    figures (see ``rss_peak``). Frees of objects allocated before the call are not counted.
    """
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        result = fn()
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, MemoryUse(retained=current - start, peak=peak - start)


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def resident_bytes() -> int:
    """This process's resident set now."""
    return status_kib("VmRSS") * 1024


def rss_retained(fn: Callable[[], object]) -> tuple[object, int | None]:
    """Run ``fn``, keep what it returns, and return how much more memory the process holds
    afterwards, in bytes: the resident set after the garbage collector and malloc_trim (so
    that memory freed by ``fn`` is given back) minus the same before. It sees what C
    libraries allocate (a roaring bitmap), which tracemalloc does not. Linux with glibc only.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return fn(), None

    def settled() -> int:
        gc.collect()
        libc.malloc_trim(0)
        return status_kib("VmRSS") * 1024

    before = settled()
    result = fn()
    return result, settled() - before


def rss_peak(fn: Callable[[], object]) -> tuple[object, int | None]:
    """Run ``fn`` and return how far the resident set rose above its start, in bytes.

    Counts everything, libpq's result buffer included. Linux only: writing 5 to
    /proc/self/clear_refs resets the high-water mark; None where that is not possible.
    """
    gc.collect()
    try:
        _CLEAR_REFS.write_text("5")
        before = status_kib("VmRSS")
    except OSError:
        return fn(), None
    result = fn()
    return result, (status_kib("VmHWM") - before) * 1024


def set_floor_bytes(ids: Iterable[int]) -> int:
    """What a bare Python set of these ids holds: its table plus one int object per id.

    The ids are read back out of an array so that the set owns freshly made ints, as the
    cache does when it builds its set from the rows it fetched.
    """
    packed = array.array("q", ids)
    made, use = traced(lambda: set(packed))
    del made
    return use.retained


def leave_records(count: int, *, active_share: float, seed: int, space: int | None = None) -> list[tuple[int, bytes]]:
    """``count`` rows of (user_id, 9-byte record) in random id order, ``active_share`` of them
    ACTIVE, ids drawn from 1..``space`` (default ``ID_SPACE`` times ``count``).

    ACTIVE rows are users who left and rejoined: they keep their ``left_at_ns``.
    """
    rng = random.Random(seed)
    ids = rng.sample(range(1, (space or ID_SPACE * count) + 1), count)
    active = round(count * active_share)
    return [
        (
            user_id,
            serialize_membership(
                CommunityMembership(
                    user_id,
                    MembershipStatus.ACTIVE if index < active else MembershipStatus.LEFT,
                    LEFT_AT_BASE_NS + index * 10**9,
                )
            ),
        )
        for index, user_id in enumerate(ids)
    ]


def absent_ids(present: set[int], count: int, *, space: int, rng: random.Random) -> list[int]:
    """``count`` distinct ids from 1..space that are not in ``present``."""
    chosen: set[int] = set()
    while len(chosen) < count:
        candidate = rng.randint(1, space)
        if candidate not in present:
            chosen.add(candidate)
    return list(chosen)


def probe_ids(present: Sequence[int], count: int, *, space: int, seed: int) -> list[int]:
    """Half ids that have a record, half that do not, shuffled.

    Each probe is a new int object, as an id read from a signal would be: a probe that is
    the very object stored in the dict would match by identity and flatter the floor.
    """
    rng = random.Random(seed)
    hits = rng.choices(present, k=count // 2)
    misses = absent_ids(set(present), count - len(hits), space=space, rng=rng)
    probes = hits + misses
    rng.shuffle(probes)
    return array.array("q", probes).tolist()


def copy_rows(
    conn: psycopg.Connection[Any],
    table: str,
    columns: str,
    types: list[str],
    rows: Iterable[Any],
    *,
    vacuum: bool = True,
) -> None:
    """Load rows with a binary COPY, then (with ``vacuum``) VACUUM ANALYZE so every reader finds a settled table."""
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
        if vacuum:
            cursor.execute(f"VACUUM ANALYZE {table}")


def copy_records(conn: psycopg.Connection[Any], table: str, rows: Iterable[tuple[int, bytes]]) -> None:
    """Leave records (user_id, value) by a binary COPY."""
    copy_rows(conn, table, "user_id, value", ["int8", "bytea"], rows)


# Each aggregate table, its target column, and the signals' column of the targets credited.
AGGREGATES = (
    ("signals_app_communityaggregate", "community_id", "credited_communities"),
    ("signals_app_cohortaggregate", "cohort_id", "credited_cohorts"),
)


def make_groups(conn: psycopg.Connection[Any], communities: int, cohorts: int, now: Any) -> None:
    """Communities c1..c``communities`` and cohorts k1..k``cohorts``, made by the database."""
    for table, count, prefix, name in (
        ("community_community", communities, "c", "community "),
        ("community_cohort", cohorts, "k", "cohort "),
    ):
        conn.execute(
            f"INSERT INTO {table} (slug, name, created_at) SELECT %s || g, %s || g, %s FROM generate_series(1, %s) g",
            [prefix, name, now, count],
        )


def add_up_aggregates(conn: psycopg.Connection[Any]) -> None:
    """Both aggregate tables as the attributed signals add up, by target, hour, item and kind."""
    for table, target, credited in AGGREGATES:
        conn.execute(
            f"INSERT INTO {table} ({target}, hour, item_id, kind, count, weight_sum, last_at) "
            "SELECT c.target::bigint, date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',"
            " s.item_id, s.kind, count(*), sum(s.weight), max(s.occurred_at) "
            f"FROM signals_app_signal s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) c(target) "
            "WHERE s.outcome = 1 GROUP BY 1, 2, 3, 4"
        )
