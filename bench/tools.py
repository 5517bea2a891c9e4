"""Timing, memory and data helpers for the benchmarks: psycopg and the codec, no Django."""

from __future__ import annotations

import array
import gc
import random
import time
import timeit
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from community.membership import CommunityMembership, MembershipStatus, serialize_membership

# Leavers are a sparse subset of all users: ids are drawn from ID_SPACE times as many ids.
ID_SPACE = 10
# Where left_at_ns starts: 2024-01-01T00:00:00Z, one record a second after it.
LEFT_AT_BASE_NS = 1_704_067_200 * 10**9


def time_rounds(
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]], rounds: int
) -> dict[str, list[float]]:
    """Seconds of each case's ``run`` per round, after its untimed ``prepare``, alternating the
    cases so that drift hits all alike. The garbage collector stays on, as in production, but
    starts each round empty; what a call returns is dropped after the clock stops."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (prepare, run) in cases.items():
            prepare()
            gc.collect()
            started = time.perf_counter()
            result = run()
            samples[name].append(time.perf_counter() - started)
            del result
    return samples


def statement_rounds(
    statements: dict[str, str], namespace: dict[str, Any], rounds: int, number: int = 1
) -> dict[str, list[float]]:
    """Seconds a call of each statement, timeit ``number`` times a round, alternating them."""
    timers = {name: timeit.Timer(statement, globals=namespace) for name, statement in statements.items()}
    samples: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number=number) / number)
    return samples


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


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


def leave_records(count: int, *, active_share: float, seed: int, space: int | None = None) -> list[tuple[int, bytes]]:
    """``count`` rows of (user_id, 9-byte record) in random id order, ``active_share`` of them
    ACTIVE (users who left and rejoined: they keep their ``left_at_ns``), ids drawn from
    1..``space`` (default ``ID_SPACE`` times ``count``)."""
    rng = random.Random(seed)
    ids = rng.sample(range(1, (space or ID_SPACE * count) + 1), count)
    active = round(count * active_share)

    def record(index: int, user_id: int) -> tuple[int, bytes]:
        status = MembershipStatus.ACTIVE if index < active else MembershipStatus.LEFT
        return user_id, serialize_membership(CommunityMembership(user_id, status, LEFT_AT_BASE_NS + index * 10**9))

    return [record(index, user_id) for index, user_id in enumerate(ids)]


def absent_ids(present: set[int], count: int, *, space: int, rng: random.Random) -> list[int]:
    """``count`` distinct ids from 1..space that are not in ``present``."""
    chosen: set[int] = set()
    while len(chosen) < count:
        candidate = rng.randint(1, space)
        if candidate not in present:
            chosen.add(candidate)
    return list(chosen)


def probe_ids(present: Sequence[int], count: int, *, space: int, seed: int) -> list[int]:
    """Half ids that have a record, half that do not, shuffled. Each probe is a new int object,
    as an id read from a signal would be: the very object stored in the dict would match by
    identity and flatter the floor."""
    rng = random.Random(seed)
    hits = rng.choices(present, k=count // 2)
    probes = hits + absent_ids(set(present), count - len(hits), space=space, rng=rng)
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
