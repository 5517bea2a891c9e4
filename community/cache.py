"""The process-local leave cache, its cross-process fence and the gate.

Every process (web worker, Celery worker child) holds the set of user ids whose signals
must not be attributed or forwarded: users whose record says LEFT, and users whose record
is corrupt (fail closed). A process-local cache alone would break the stop-forward promise
as soon as there are two processes, so the cache is fenced: before it gates a batch the
process reads the single ``LeaveClock`` row (one query) and, only when the clock moved,
replays the history rows written since its last look, in version order. The clock row is
locked by every leave/rejoin transaction, so versions commit in order and the feed has no
gaps. A new ``generation`` (bumped by ``rebuild_leave_status``) makes it re-warm from the
records. There is no TTL and nothing is trusted that has not been read from the database
in this sync: if the database cannot be read, ``sync`` raises and nothing is gated "active".

Warming: never in ``AppConfig.ready()`` and never at import. Celery worker children warm on
``worker_process_init``; any other process warms on its first ``gate()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from django.conf import settings
from django.db import DatabaseError, NotSupportedError, OperationalError, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler

from tidalproject import metrics

from .membership import MembershipStatus, deserialize_membership

logger = logging.getLogger(__name__)

CORRUPT = -1
_WARM_CHUNK = 10_000
_CLOCK_SQL = "SELECT version, generation FROM {table} WHERE id = 1"


class RecordStatus(models.Func):
    """SQL for a stored record's status: 0 active, 1 left, -1 corrupt.

    The same rule as ``deserialize_membership`` (exactly 9 bytes, first byte 0 or 1),
    evaluated by the database so that warming and the admin filter need not fetch and
    decode every value. A test holds the two to the same answers.
    """

    output_field = models.IntegerField()
    arity = 1

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> Any:
        raise NotSupportedError(f"RecordStatus has no SQL for {connection.vendor}")

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> Any:
        template = (
            "CASE WHEN octet_length(%(expressions)s) = 9 AND get_byte(%(expressions)s, 0) IN (0, 1)"
            " THEN get_byte(%(expressions)s, 0) ELSE -1 END"
        )
        return super().as_sql(compiler, connection, template=template, **extra_context)

    def as_sqlite(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any) -> Any:
        template = (
            "CASE WHEN typeof(%(expressions)s) = 'blob' AND length(%(expressions)s) = 9 THEN"
            " CASE substr(%(expressions)s, 1, 1) WHEN X'00' THEN 0 WHEN X'01' THEN 1 ELSE -1 END"
            " ELSE -1 END"
        )
        return super().as_sql(compiler, connection, template=template, **extra_context)


class LeaveGate:
    """The gate after a sync: ``is_left(user_id)`` is an in-memory set look-up, no query.

    It reads the process's live set, so later syncs in this process (which only move the
    fence forward) show through; ``version`` is the fence position it was handed at.
    """

    __slots__ = ("generation", "is_left", "version")

    def __init__(self, gated: set[int], version: int, generation: int) -> None:
        self.is_left = gated.__contains__
        self.version = version
        self.generation = generation


def _gated_query(using: str) -> Any:
    """The ids the gate must hold: records that are LEFT or cannot be read."""
    from .models import CommunityLeave

    return (
        CommunityLeave.objects.using(using)
        .annotate(record_status=RecordStatus("value"))
        .exclude(record_status=MembershipStatus.ACTIVE)
        .values_list("user_id", flat=True)
    )


class LeaveCache:
    """The gated user ids of this process and the fence position they are valid at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gated: set[int] = set()
        self._version: int | None = None  # None: not warmed
        self._generation: int | None = None
        self.warms = 0
        self.syncs = 0
        self.feed_rows = 0
        self.last_warm_seconds = 0.0
        self.last_lag = 0
        _caches.add(self)

    @property
    def warmed(self) -> bool:
        return self._version is not None

    @property
    def size(self) -> int:
        return len(self._gated)

    def report(self, *, using: str = "default", compare: bool = False) -> dict[str, Any]:
        """Sync, then describe this process's cache; with ``compare``, check it against the
        records themselves (a full read of the gated ids: for operators and drills)."""
        gate = self.sync(using)
        state: dict[str, Any] = {
            "pid": os.getpid(),
            "version": gate.version,
            "generation": gate.generation,
            "size": self.size,
            "warms": self.warms,
            "syncs": self.syncs,
            "feed_rows": self.feed_rows,
            "last_warm_seconds": round(self.last_warm_seconds, 6),
            "last_lag": self.last_lag,
        }
        if compare:
            with self._lock:
                held = set(self._gated)
            stored = set(_gated_query(using))
            state["matches_database"] = held == stored
            state["only_in_cache"] = len(held - stored)
            state["only_in_database"] = len(stored - held)
        return state

    def reset(self) -> None:
        """Forget everything: the next sync re-warms."""
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        self._gated = set()
        self._version = None
        self._generation = None

    def _after_fork_in_child(self) -> None:
        # A lock held by another thread at fork time would never be released in the child.
        self._lock = threading.Lock()
        self._forget()

    def sync(self, using: str = "default") -> LeaveGate:
        """Bring the cache up to the database's fence and return the gate.

        One query when nothing changed; the feed since the last look when something did;
        a full re-warm on a new generation, on first use, or when far behind. Raises
        ``DatabaseError`` when the database cannot be read: callers retry, never guess.
        """
        from .models import LeaveClock

        with self._lock:
            self.syncs += 1
            # The fence: one single-row read, by primary key (raw SQL: the ORM would
            # more than double the cost of a sync that finds nothing changed).
            with connections[using].cursor() as cursor:
                cursor.execute(_CLOCK_SQL.format(table=LeaveClock._meta.db_table))
                clock = cursor.fetchone()
            if clock is None:
                raise OperationalError("the leave clock row is missing: run migrate")
            version, generation = clock
            if self._version is None or generation != self._generation:
                self._warm(using, version, generation)
                result = "warm"
            elif version != self._version:
                self.last_lag = version - self._version
                if self.last_lag > settings.LEAVE_CACHE_REWARM_AFTER:
                    self._warm(using, version, generation)
                    result = "warm"
                else:
                    self._apply_feed(using, version)
                    result = "feed"
            else:
                self.last_lag = 0
                result = "unchanged"
            metrics.FENCE_SYNCS.labels(result=result).inc()
            if result != "unchanged":
                metrics.CACHE_SIZE.set(len(self._gated))
            assert self._version is not None and self._generation is not None
            return LeaveGate(self._gated, self._version, self._generation)

    def _warm(self, using: str, version: int, generation: int) -> None:
        # The clock was read before the records, so every change after ``version`` is
        # either already in what we read or replayed (again, harmlessly) by the next sync.
        started = time.perf_counter()
        query = _gated_query(using)
        # The queryset's SQL, read straight off the cursor in chunks: a million ids go into
        # the set without the ORM's per-row iteration and intermediate lists.
        sql, params = query.query.sql_with_params()
        gated: set[int] = set()
        with connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            while chunk := cursor.fetchmany(_WARM_CHUNK):
                gated.update(row[0] for row in chunk)
        self._gated = gated
        self._version = version
        self._generation = generation
        self.warms += 1
        self.last_lag = 0
        self.last_warm_seconds = time.perf_counter() - started
        metrics.CACHE_WARM_SECONDS.observe(self.last_warm_seconds)
        logger.info(
            "leave cache warmed: %d gated users at version %d generation %d in %.3fs",
            len(gated),
            version,
            generation,
            self.last_warm_seconds,
        )

    def _apply_feed(self, using: str, version: int) -> None:
        from .models import LeaveHistory

        assert self._version is not None
        last = self._version
        changes = (
            LeaveHistory.objects.using(using)
            .filter(version__gt=last)
            .order_by("version")
            .values_list("version", "user_id", "value")
        )
        gated = self._gated
        for change_version, user_id, value in changes:
            record = deserialize_membership(user_id, value)
            if record is None or record.status == MembershipStatus.LEFT:
                gated.add(user_id)
            else:
                gated.discard(user_id)
            last = change_version
            self.feed_rows += 1
        # Versions up to ``version`` were committed before the clock read, so ``last`` can
        # only be at or past it; max() keeps the fence monotonic either way.
        self._version = max(last, version)


_caches: weakref.WeakSet[LeaveCache] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # A child must not inherit a lock held by another thread at fork time; re-warming
    # in the child is the design's rule anyway (warm after fork).
    for cache in list(_caches):
        cache._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


def warm_after_worker_fork(**_: Any) -> None:
    """Celery ``worker_process_init``: warm the new worker child before it takes work."""
    from .models import CommunityLeave

    try:
        CommunityLeave.objects.gate()
    except DatabaseError:
        # Not fatal: the first batch syncs again and retries until the database answers.
        logger.warning("leave cache could not warm at worker start; it warms on first use", exc_info=True)
