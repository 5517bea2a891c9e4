"""Data of the pipeline benchmark: users in communities and cohorts, leavers, pending signals.

Everything is drawn from one seed, so every load of the pending signals holds the same rows
under the same ids, and the aggregates they must produce can be computed here, in Python.
Imported only after ``django.setup()``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any, NamedTuple

import psycopg

from bench import pipeline_floor as floor
from bench import tools
from bench.pipeline_floor import AGGREGATE_TABLES, KINDS, MEMBER_TABLES, SIGNAL_TABLE, TARGETS, WEIGHTS
from community.models import ChangeSource, Cohort, CohortMember, Community, CommunityLeave, CommunityMember
from community.services.layer import bulk_leave_community_layer
from signals_app.models import CohortAggregate, CommunityAggregate, GatedReason, Outcome, Signal

# The floor runs without Django: its tables and codes must be the models'.
MODELS = (Signal, CommunityAggregate, CohortAggregate, CommunityMember, CohortMember, Community, Cohort, CommunityLeave)
FLOOR_TABLES = (SIGNAL_TABLE, *AGGREGATE_TABLES, *MEMBER_TABLES, *floor.GROUP_TABLES, floor.LEAVE_TABLE)
assert [model._meta.db_table for model in MODELS] == list(FLOOR_TABLES)
FLOOR_CODES = (floor.ATTRIBUTED, floor.GATED, floor.NO_TARGET, floor.LEFT_AT_PROCESSING)
assert FLOOR_CODES == (Outcome.ATTRIBUTED, Outcome.GATED, Outcome.NO_TARGET, GatedReason.LEFT_AT_PROCESSING)

COMMUNITIES, COHORTS, ITEMS, HOURS = 100, 30, 5_000, 24
MAX_COMMUNITIES, MAX_COHORTS = 6, 4  # each user in 0..6 communities (3 on average), 0..4 cohorts (2)
LEFT_SHARE = 0.10
KIND_WEIGHTS = (70, 15, 5, 10)  # of pipeline_floor.KINDS
LEAVE_CHUNK = 1_000

# (target id, hour, item id, kind) -> (count, weight sum, last time)
Aggregates = dict[tuple[int, datetime, int, str], tuple[int, float, datetime]]


@dataclass
class Dataset:
    base: datetime  # the first hour signals occur in
    user_ids: list[int]
    sender_id: int
    communities: dict[int, list[int]] = field(default_factory=dict)  # user id -> community ids
    cohorts: dict[int, list[int]] = field(default_factory=dict)  # user id -> cohort ids
    left: set[int] = field(default_factory=set)
    # (id, user_id, item_id, kind, weight, occurred_at), ids 1..signals
    signals: list[tuple[int, int, int, str, float, datetime]] = field(default_factory=list)


def create(conn: psycopg.Connection[Any], signals: int, users: int, seed: int, sender_id: int) -> Dataset:
    """Create the communities, cohorts, memberships (a binary COPY) and leaves (through
    ``bulk_leave_community_layer``, chunks of 1,000); draw the pending signals."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    base = (now - timedelta(hours=HOURS)).replace(minute=0, second=0, microsecond=0)
    data = Dataset(base, rng.sample(range(1, 10 * users + 1), users), sender_id)
    tools.make_groups(conn, COMMUNITIES, COHORTS, now)
    community_ids, cohort_ids = (
        [row[0] for row in conn.execute(f"SELECT id FROM {table} ORDER BY id")] for table in floor.GROUP_TABLES
    )
    for user_id in data.user_ids:
        if joined := rng.sample(community_ids, rng.randint(0, MAX_COMMUNITIES)):
            data.communities[user_id] = sorted(joined)
        if joined := rng.sample(cohort_ids, rng.randint(0, MAX_COHORTS)):
            data.cohorts[user_id] = sorted(joined)
    for table, target, members in zip(MEMBER_TABLES, TARGETS, (data.communities, data.cohorts), strict=True):
        rows = ((target_id, user_id, now) for user_id, targets in members.items() for target_id in targets)
        tools.copy_rows(conn, table, f"{target}, user_id, joined_at", ["int8", "int8", "timestamptz"], rows)

    leavers = rng.sample(data.user_ids, round(users * LEFT_SHARE))
    for start in range(0, len(leavers), LEAVE_CHUNK):
        bulk_leave_community_layer(user_ids=leavers[start : start + LEAVE_CHUNK], source=ChangeSource.COMMAND)
    data.left = set(leavers)

    rng = random.Random(seed + 1)
    zipf = list(accumulate(1.0 / rank for rank in range(1, ITEMS + 1)))  # a few popular items, a long tail
    span = HOURS * 3_600_000_000  # microseconds
    data.signals = list(
        zip(
            range(1, signals + 1),
            rng.choices(data.user_ids, k=signals),
            rng.choices(range(1, ITEMS + 1), cum_weights=zipf, k=signals),
            rng.choices(KINDS, weights=KIND_WEIGHTS, k=signals),
            rng.choices(WEIGHTS, k=signals),
            [base + timedelta(microseconds=rng.randrange(span)) for _ in range(signals)],
            strict=True,
        )
    )
    return data


def load_pending(conn: psycopg.Connection[Any], data: Dataset, *, fence: int | None = None) -> None:
    """Empty the signals and both aggregates, then load every signal as pending, same ids,
    received at leave clock version ``fence`` (None: no receipt fence).

    VACUUM ANALYZE and a CHECKPOINT after it: each run starts from a settled table with
    clean buffers, and none pays for the writes of the run before it.
    """
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
    for table in tables:
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("CHECKPOINT")


BARE = "bare_"
_BARE_TABLES = (SIGNAL_TABLE, *AGGREGATE_TABLES, *MEMBER_TABLES)


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
    vacuum(conn, tuple(BARE + table for table in _BARE_TABLES))
    try:
        yield
    finally:
        for table in _BARE_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {BARE}{table}")


class Written(NamedTuple):
    """What a run left in the database, or what it must leave."""

    community: Aggregates
    cohort: Aggregates
    outcomes: list[int]  # by signal id - 1


def expected(data: Dataset) -> Written:
    """What processing every signal must produce, computed from the data alone."""
    tables: tuple[dict[Any, list[Any]], dict[Any, list[Any]]] = ({}, {})
    outcomes: list[int] = []
    for _, user_id, item_id, kind, weight, occurred_at in data.signals:
        targets = (data.communities.get(user_id, ()), data.cohorts.get(user_id, ()))
        if user_id in data.left:
            outcomes.append(Outcome.GATED)
        elif not (targets[0] or targets[1]):
            outcomes.append(Outcome.NO_TARGET)
        else:
            outcomes.append(Outcome.ATTRIBUTED)
            hour = occurred_at.replace(minute=0, second=0, microsecond=0)
            for table, target_ids in zip(tables, targets, strict=True):
                for target_id in target_ids:
                    row = table.setdefault((target_id, hour, item_id, kind), [0, 0.0, occurred_at])
                    row[0] += 1
                    row[1] += weight
                    row[2] = max(row[2], occurred_at)
    community, cohort = ({key: tuple(value) for key, value in table.items()} for table in tables)
    return Written(community, cohort, [int(outcome) for outcome in outcomes])  # type: ignore[arg-type]


def read_written(conn: psycopg.Connection[Any]) -> Written:
    def aggregates(table: str, target: str) -> Aggregates:
        rows = conn.execute(f"SELECT {target}, hour, item_id, kind, count, weight_sum, last_at FROM {table}")
        return {(t, h, i, k): (c, w, last) for t, h, i, k, c, w, last in rows}

    return Written(
        *(aggregates(table, target) for table, target in zip(AGGREGATE_TABLES, TARGETS, strict=True)),
        [row[0] for row in conn.execute(f"SELECT outcome FROM {SIGNAL_TABLE} ORDER BY id")],
    )


def differences(label: str, got: Written, want: Written) -> list[str]:
    """Human-readable differences between what a run wrote and what it should have."""
    found: list[str] = []
    for name, mine, theirs in (("community", got.community, want.community), ("cohort", got.cohort, want.cohort)):
        if mine != theirs:
            differing = sum(1 for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
            found.append(
                f"{label}: {name} aggregates differ ({len(mine):,} rows vs {len(theirs):,}, {differing:,} of them"
                " missing, extra or with other values)"
            )
    if got.outcomes != want.outcomes:
        wrong = sum(1 for a, b in zip(got.outcomes, want.outcomes, strict=False) if a != b)
        found.append(
            f"{label}: {wrong:,} signal outcomes differ ({len(got.outcomes):,} vs {len(want.outcomes):,} signals)"
        )
    if pending := got.outcomes.count(Outcome.PENDING):
        found.append(f"{label}: {pending:,} signals left pending")
    return found
