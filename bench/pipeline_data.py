"""Data of the pipeline benchmark: users in communities and cohorts, leavers, pending signals.

Everything is drawn from one seed, so every load of the pending signals holds the same rows
under the same ids, and the aggregates they must produce can be computed here, in Python.
Imported only after ``django.setup()``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import accumulate
from typing import Any

import psycopg

from bench import tools
from community.models import ChangeSource, Cohort, CohortMember, Community, CommunityMember
from community.services.layer import bulk_leave_community_layer
from signals_app.models import CohortAggregate, CommunityAggregate, Outcome, Signal

SIGNAL_TABLE = Signal._meta.db_table
COMMUNITY_AGGREGATE_TABLE = CommunityAggregate._meta.db_table
COHORT_AGGREGATE_TABLE = CohortAggregate._meta.db_table
COMMUNITY_MEMBER_TABLE = CommunityMember._meta.db_table
COHORT_MEMBER_TABLE = CohortMember._meta.db_table

KINDS = ("view", "like", "share", "comment")
KIND_WEIGHTS = (70, 15, 5, 10)
# Binary fractions: their sums are exact in any order, so two pipelines that add the same
# increments in another order still write bit-identical weight sums.
WEIGHTS = (1.0, 1.0, 1.0, 2.0, 5.0, 0.5)
LEAVE_CHUNK = 1_000

# (target id, hour, item id, kind) -> (count, weight sum, last time)
Aggregates = dict[tuple[int, datetime, int, str], tuple[int, float, datetime]]


@dataclass(frozen=True)
class Shape:
    """How much of everything: users are in ``max_communities / 2`` communities on average."""

    signals: int
    users: int
    communities: int
    cohorts: int
    items: int
    hours: int
    left_share: float
    max_communities: int
    max_cohorts: int
    seed: int


@dataclass
class Dataset:
    shape: Shape
    base: datetime  # the first hour signals occur in
    user_ids: list[int]
    communities: dict[int, list[int]] = field(default_factory=dict)  # user id -> community ids
    cohorts: dict[int, list[int]] = field(default_factory=dict)  # user id -> cohort ids
    left: set[int] = field(default_factory=set)
    # (id, user_id, item_id, kind, weight, occurred_at), ids 1..signals
    signals: list[tuple[int, int, int, str, float, datetime]] = field(default_factory=list)
    sender_id: int = 0

    @property
    def community_memberships(self) -> int:
        return sum(map(len, self.communities.values()))

    @property
    def cohort_memberships(self) -> int:
        return sum(map(len, self.cohorts.values()))


def zipf_cum_weights(count: int, exponent: float = 1.0) -> list[float]:
    """Cumulative weights of a Zipf law over 1..count: a few popular items, a long tail."""
    return list(accumulate(1.0 / rank**exponent for rank in range(1, count + 1)))


def make_signals(shape: Shape, user_ids: list[int], base: datetime) -> list[tuple[int, int, int, str, float, datetime]]:
    rng = random.Random(shape.seed + 1)
    users = rng.choices(user_ids, k=shape.signals)
    items = rng.choices(range(1, shape.items + 1), cum_weights=zipf_cum_weights(shape.items), k=shape.signals)
    kinds = rng.choices(KINDS, weights=KIND_WEIGHTS, k=shape.signals)
    weights = rng.choices(WEIGHTS, k=shape.signals)
    span = shape.hours * 3_600_000_000  # microseconds
    moments = [base + timedelta(microseconds=rng.randrange(span)) for _ in range(shape.signals)]
    return list(zip(range(1, shape.signals + 1), users, items, kinds, weights, moments, strict=True))


def create(conn: psycopg.Connection[Any], shape: Shape, sender_id: int) -> Dataset:
    """Create the communities, cohorts, memberships and leaves; draw the pending signals.

    Communities and cohorts go through the ORM, memberships through a binary COPY, and the
    leaves through ``bulk_leave_community_layer`` (chunks of 1,000), as the brief asks.
    """
    rng = random.Random(shape.seed)
    now = datetime.now(UTC)
    base = (now - timedelta(hours=shape.hours)).replace(minute=0, second=0, microsecond=0)
    data = Dataset(shape=shape, base=base, user_ids=rng.sample(range(1, 10 * shape.users + 1), shape.users))
    data.sender_id = sender_id
    made = [
        model.objects.bulk_create([model(slug=f"bench-{kind}-{i}", name=f"{kind.title()} {i}") for i in range(count)])
        for model, kind, count in ((Community, "community", shape.communities), (Cohort, "cohort", shape.cohorts))
    ]
    community_ids, cohort_ids = ([group.pk for group in groups] for groups in made)
    for user_id in data.user_ids:
        if joined := rng.sample(community_ids, rng.randint(0, shape.max_communities)):
            data.communities[user_id] = sorted(joined)
        if joined := rng.sample(cohort_ids, rng.randint(0, shape.max_cohorts)):
            data.cohorts[user_id] = sorted(joined)
    for table, target, members in (
        (COMMUNITY_MEMBER_TABLE, "community_id", data.communities),
        (COHORT_MEMBER_TABLE, "cohort_id", data.cohorts),
    ):
        rows = ((target_id, user_id, now) for user_id, targets in members.items() for target_id in targets)
        tools.copy_rows(conn, table, f"{target}, user_id, joined_at", ["int8", "int8", "timestamptz"], rows)

    leavers = rng.sample(data.user_ids, round(shape.users * shape.left_share))
    for start in range(0, len(leavers), LEAVE_CHUNK):
        bulk_leave_community_layer(user_ids=leavers[start : start + LEAVE_CHUNK], source=ChangeSource.COMMAND)
    data.left = set(leavers)
    data.signals = make_signals(shape, data.user_ids, base)
    return data


def load_pending(conn: psycopg.Connection[Any], data: Dataset, *, fence: int | None = None) -> None:
    """Empty the signals and both aggregates, then load every signal as pending, same ids,
    received at leave clock version ``fence`` (None: no receipt fence, as before it existed).

    VACUUM ANALYZE and a CHECKPOINT after it: each run starts from a settled table with
    clean buffers, and none pays for the writes of the run before it.
    """
    received, sender, pending = data.base + timedelta(hours=data.shape.hours), data.sender_id, Outcome.PENDING.value
    conn.execute(f"TRUNCATE {SIGNAL_TABLE}, {COMMUNITY_AGGREGATE_TABLE}, {COHORT_AGGREGATE_TABLE} RESTART IDENTITY")
    columns = "id, sender_id, user_id, item_id, kind, weight, occurred_at, received_at, outcome, fence_at_receipt"
    types = ["int8", "int4", "int8", "int8", "varchar", "float8", "timestamptz", "timestamptz", "int2", "int8"]
    rows = ((i, sender, u, item, kind, w, at, received, pending, fence) for i, u, item, kind, w, at in data.signals)
    tools.copy_rows(conn, SIGNAL_TABLE, columns, types, rows, vacuum=False)
    conn.execute(f"SELECT setval(pg_get_serial_sequence('{SIGNAL_TABLE}', 'id'), %s)", (len(data.signals),))
    for table in (SIGNAL_TABLE, COMMUNITY_AGGREGATE_TABLE, COHORT_AGGREGATE_TABLE):
        conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("CHECKPOINT")


BARE = "bare_"
_BARE_KEYS = {
    COMMUNITY_AGGREGATE_TABLE: "UNIQUE (community_id, hour, item_id, kind)",
    COHORT_AGGREGATE_TABLE: "UNIQUE (cohort_id, hour, item_id, kind)",
}
_BARE_TABLES = (SIGNAL_TABLE, *_BARE_KEYS, COMMUNITY_MEMBER_TABLE, COHORT_MEMBER_TABLE)


def make_bare_copies(conn: psycopg.Connection[Any]) -> None:
    """Copies of the pipeline's tables with the same rows and nothing but what the set-based
    statement needs: primary keys, the upserts' unique keys, an index of members by user."""
    drop_bare_copies(conn)
    conn.execute(f"CREATE TABLE {BARE}{SIGNAL_TABLE} AS SELECT * FROM {SIGNAL_TABLE}")
    conn.execute(f"ALTER TABLE {BARE}{SIGNAL_TABLE} ADD PRIMARY KEY (id)")
    for table, key in _BARE_KEYS.items():
        conn.execute(f"CREATE TABLE {BARE}{table} (LIKE {table} INCLUDING DEFAULTS INCLUDING IDENTITY)")
        conn.execute(f"ALTER TABLE {BARE}{table} ADD {key}")
    for table in (COMMUNITY_MEMBER_TABLE, COHORT_MEMBER_TABLE):
        conn.execute(f"CREATE TABLE {BARE}{table} AS SELECT * FROM {table}")
        conn.execute(f"CREATE INDEX ON {BARE}{table} (user_id)")
    for table in _BARE_TABLES:
        conn.execute(f"VACUUM ANALYZE {BARE}{table}")
    conn.execute("CHECKPOINT")


def product_extras(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """The indexes and constraints the product's pipeline tables have beyond their bare
    copies': (name, the statement that adds it to the bare copy)."""
    tables = list(_BARE_TABLES)
    extras: list[tuple[str, str]] = []
    for index, definition in conn.execute(
        "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = ANY(%s) AND NOT EXISTS ("
        " SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)",
        [tables],
    ):
        table = definition.split(" ON ", 1)[1].split(" ", 2)[1].removeprefix("public.")
        extras.append(
            (
                f"index {index}",
                definition.replace(f" ON public.{table} ", f" ON {BARE}{table} ", 1).replace(index, f"bare_{index}", 1),
            )
        )
    for table, name, definition, kind in conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype FROM pg_constraint"
        " WHERE conrelid = ANY(%s::regclass[]) AND contype IN ('f', 'u', 'c')",
        [tables],
    ):
        if kind == "u" and table in _BARE_KEYS:
            continue  # the upsert's key: the bare copy has it already
        extras.append(
            (f"{'foreign key' if kind == 'f' else 'constraint'} {name}", f"ALTER TABLE {BARE}{table} ADD {definition}")
        )
    return sorted(extras)


def drop_bare_copies(conn: psycopg.Connection[Any]) -> None:
    for table in _BARE_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {BARE}{table}")


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Expected:
    community: Aggregates
    cohort: Aggregates
    outcomes: list[int]  # by signal id - 1


def expected(data: Dataset) -> Expected:
    """What processing every signal must produce, computed from the data alone."""
    tables: tuple[dict[Any, list[Any]], dict[Any, list[Any]]] = ({}, {})
    outcomes: list[int] = []
    for _, user_id, item_id, kind, weight, occurred_at in data.signals:
        if user_id in data.left:
            outcomes.append(Outcome.GATED)
            continue
        targets = (data.communities.get(user_id, ()), data.cohorts.get(user_id, ()))
        if not (targets[0] or targets[1]):
            outcomes.append(Outcome.NO_TARGET)
            continue
        outcomes.append(Outcome.ATTRIBUTED)
        hour = _hour(occurred_at)
        for table, target_ids in zip(tables, targets, strict=True):
            for target_id in target_ids:
                row = table.get((target_id, hour, item_id, kind))
                if row is None:
                    table[target_id, hour, item_id, kind] = [1, weight, occurred_at]
                else:
                    row[0] += 1
                    row[1] += weight
                    row[2] = max(row[2], occurred_at)
    community, cohort = ({key: tuple(value) for key, value in table.items()} for table in tables)
    return Expected(community=community, cohort=cohort, outcomes=[int(o) for o in outcomes])  # type: ignore[arg-type]


@dataclass(frozen=True)
class Written:
    """What a run left in the database."""

    community: Aggregates
    cohort: Aggregates
    outcomes: list[int]
    pending: int

    def outcome_counts(self) -> Counter[int]:
        return Counter(self.outcomes)


def read_written(conn: psycopg.Connection[Any]) -> Written:
    def aggregates(table: str, target: str) -> Aggregates:
        rows = conn.execute(f"SELECT {target}, hour, item_id, kind, count, weight_sum, last_at FROM {table}")
        return {(t, h, i, k): (c, w, last) for t, h, i, k, c, w, last in rows}

    outcomes = [row[0] for row in conn.execute(f"SELECT outcome FROM {SIGNAL_TABLE} ORDER BY id")]
    return Written(
        community=aggregates(COMMUNITY_AGGREGATE_TABLE, "community_id"),
        cohort=aggregates(COHORT_AGGREGATE_TABLE, "cohort_id"),
        outcomes=outcomes,
        pending=sum(1 for outcome in outcomes if outcome == Outcome.PENDING),
    )


def differences(label: str, got: Written, want: Expected | Written) -> list[str]:
    """Human-readable differences between what a run wrote and what it should have."""
    found: list[str] = []
    for name in ("community", "cohort"):
        mine, theirs = getattr(got, name), getattr(want, name)
        if mine != theirs:
            missing = len(theirs.keys() - mine.keys())
            extra = len(mine.keys() - theirs.keys())
            changed = sum(1 for key in mine.keys() & theirs.keys() if mine[key] != theirs[key])
            found.append(
                f"{label}: {name} aggregates differ ({len(mine):,} rows vs {len(theirs):,}: "
                f"{missing:,} missing, {extra:,} extra, {changed:,} with other values)"
            )
    if got.outcomes != want.outcomes:
        wrong = sum(1 for a, b in zip(got.outcomes, want.outcomes, strict=False) if a != b)
        found.append(
            f"{label}: {wrong:,} signal outcomes differ ({len(got.outcomes):,} vs {len(want.outcomes):,} signals)"
        )
    return found
