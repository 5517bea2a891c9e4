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

import array
import logging
import math
import os
import sys
import threading
import time
import weakref
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, NotSupportedError, OperationalError, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler
from pyroaring import BitMap64

from tidalproject import metrics

from .membership import MembershipStatus, deserialize_membership

logger = logging.getLogger(__name__)

CORRUPT = -1
_WARM_CHUNK = 1_000_000
_VERSION_SQL = "SELECT version FROM {table} WHERE id = 1"


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
    """The gate after a sync: in-memory look-ups, no query per signal.

    ``is_left(user_id)`` answers at this fence position (``version``).
    ``is_left(user_id, since=v)`` also answers whether the user was left at any version
    after ``v`` up to this one: the check for a signal received at fence ``v`` that waited in
    the queue (a leave and a rejoin while it waited still gate it). The process's feed log
    answers that from memory; what it does not cover (a receipt fence older than the
    process's warm) is read from the history once per batch by ``preload``.
    """

    __slots__ = ("_cache", "_held", "_history", "generation", "version")

    def __init__(self, cache: LeaveCache, version: int, generation: int) -> None:
        self._cache = cache
        self._held = cache._gated.__contains__  # the process's live bitmap: later feeds show through
        self._history: dict[int, list[int]] = {}
        self.version = version
        self.generation = generation

    def is_corrupt(self, user_id: int) -> bool:
        return user_id in self._cache._corrupt

    def is_erased(self, user_id: int) -> bool:
        """Erased and still left: their new signals are not stored at all (suppressed)."""
        return user_id in self._cache._erased

    def is_left(self, user_id: int, since: int | None = None) -> bool:
        if self._held(user_id):
            return True
        if since is None or since >= self.version:
            return False
        return self._left_after(user_id, since)

    def _left_after(self, user_id: int, since: int) -> bool:
        history = self._history.get(user_id)
        if history is not None:
            return any(since < version <= self.version for version in history)
        cache = self._cache
        if since >= cache._log_from:
            last = cache._left_log.get(user_id)
            if last is None:
                return False
            if last <= self.version:
                return last > since
        # Not covered in memory (a receipt before this process warmed, or a later sync has
        # moved the log past this gate): fail closed unless ``preload`` read the history.
        raise LookupError(f"user {user_id}: no history loaded after version {since}")

    def preload(self, checks: dict[int, int], using: str = "default") -> None:
        """Read, in one query, the history that ``is_left(user_id, since)`` will need for
        ``checks`` (user id -> the earliest receipt fence among that user's signals)."""
        cache = self._cache
        needed = {
            user_id: since
            for user_id, since in checks.items()
            if since < self.version
            and user_id not in cache._gated
            and (since < cache._log_from or cache._left_log.get(user_id, -1) > self.version)
        }
        if not needed:
            return
        from .models import LeaveHistory

        left_versions = (
            LeaveHistory.objects.using(using)
            .annotate(record_status=RecordStatus("value"))
            .exclude(record_status=MembershipStatus.ACTIVE)
            .filter(user_id__in=list(needed), version__gt=min(needed.values()), version__lte=self.version)
            .values_list("user_id", "version")
        )
        history: dict[int, list[int]] = {user_id: [] for user_id in needed}
        for user_id, version in left_versions:
            history[user_id].append(version)
        self._history.update(history)


def _gated_query(using: str) -> Any:
    """The records the gate must hold: LEFT or unreadable (``record_status`` annotated)."""
    from .models import CommunityLeave

    return (
        CommunityLeave.objects.using(using)
        .annotate(record_status=RecordStatus("value"))
        .exclude(record_status=MembershipStatus.ACTIVE)
    )


class LeaveCache:
    """The gated user ids of this process and the fence position they are valid at."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A roaring bitmap of 64-bit ids: about 1.3 bytes a gated user when ids are dense, and
        # under 16 when they are sparse, against about 65 for a Python set (whose copies, one
        # per process, added up to gigabytes on a machine of 33 processes).
        self._gated = BitMap64()
        self._corrupt: set[int] = set()  # the gated ids whose record cannot be read
        # The gated ids whose last change that made them left was an erasure: an erase adds,
        # a change back to active (a rejoin) removes, a leave leaves it as it is.
        self._erased: set[int] = set()
        # user id -> the last version at which the feed made them left (or corrupt), for the
        # while-queued check; it covers versions after ``_log_from`` only.
        self._left_log: dict[int, int] = {}
        self._log_from = 0
        self._version: int | None = None  # None: not warmed
        self._generation: int | None = None
        self._epoch: Any = None
        # (user_id, at) of the history row at ``_version``: if the row at that version is
        # ever another one, the clock's past was rewritten (a restore, a failover).
        self._fingerprint: tuple[Any, Any] = (None, None)
        self.warms = 0
        self.syncs = 0
        self.feed_rows = 0
        self.last_warm_seconds = 0.0
        self.last_lag = 0
        self.last_warm_reason = ""
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
            "epoch": str(self._epoch),
            "size": self.size,
            "erased": len(self._erased),
            "warms": self.warms,
            "last_warm_reason": self.last_warm_reason,
            "syncs": self.syncs,
            "feed_rows": self.feed_rows,
            "last_warm_seconds": round(self.last_warm_seconds, 6),
            "last_lag": self.last_lag,
        }
        if compare:
            with self._lock:
                held = set(self._gated)  # an operator's check: a full copy is fine here
            stored = set(_gated_query(using).values_list("user_id", flat=True))
            state["matches_database"] = held == stored
            state["only_in_cache"] = len(held - stored)
            state["only_in_database"] = len(stored - held)
        return state

    def reset(self) -> None:
        """Forget everything: the next sync re-warms."""
        with self._lock:
            self._forget()

    def _forget(self) -> None:
        self._gated = BitMap64()
        self._corrupt = set()
        self._erased = set()
        self._left_log = {}
        self._version = None
        self._generation = None
        self._epoch = None

    def _after_fork_in_child(self) -> None:
        # A lock held by another thread at fork time would never be released in the child.
        self._lock = threading.Lock()
        self._forget()

    def sync(self, using: str = "default") -> LeaveGate:
        """Bring the cache up to the database's fence and return the gate.

        One query when nothing changed; the feed since the last look when something did;
        a full re-warm on first use, on a new generation or epoch, when far behind, and
        whenever the clock's past no longer matches what this process saw (the version went
        backwards, or the history row at the cached version is another one: a restore or a
        failover). Raises ``DatabaseError`` when the database cannot be read: callers retry,
        never guess.
        """
        with self._lock:
            self.syncs += 1
            # The fence: the clock row by primary key and the history row at our version, in
            # one query (raw SQL: the ORM would more than double the cost of a sync that
            # finds nothing changed).
            with connections[using].cursor() as cursor:
                cursor.execute(_fence_sql(), [-1 if self._version is None else self._version])
                clock = cursor.fetchone()
            if clock is None:
                raise OperationalError("the leave clock row is missing: run migrate")
            version, generation, epoch, user_id, at = clock
            reason = self._warm_reason(version, generation, epoch, _fingerprint((user_id, at)))
            if reason:
                self._warm(using, version, generation, epoch, reason)
                result = "warm"
            elif version != self._version:
                assert self._version is not None
                self.last_lag = version - self._version
                self._apply_feed(using, version)
                result = "feed"
            else:
                self.last_lag = 0
                result = "unchanged"
            metrics.FENCE_SYNCS.labels(result=result).inc()
            if result != "unchanged":
                metrics.CACHE_SIZE.set(len(self._gated))
            assert self._version is not None and self._generation is not None
            return LeaveGate(self, self._version, self._generation)

    def _warm_reason(self, version: int, generation: int, epoch: Any, fingerprint: tuple[Any, ...]) -> str:
        if self._version is None:
            return "first use"
        if epoch != self._epoch:
            return "new clock epoch"
        if generation != self._generation:
            return "new generation"
        if version < self._version:
            return f"clock went back from {self._version} to {version}"
        if fingerprint != self._fingerprint:
            return f"history at version {self._version} was rewritten"
        if version - self._version > settings.LEAVE_CACHE_REWARM_AFTER:
            return "far behind"
        return ""

    def _warm(self, using: str, version: int, generation: int, epoch: Any, reason: str) -> None:
        # The clock was read before the records, so every change after ``version`` is
        # either already in what we read or replayed (again, harmlessly) by the next sync.
        from .models import LeaveClock, LeaveHistory

        started = time.perf_counter()
        gated, corrupt = _read_gated(using)
        at_version = LeaveHistory.objects.using(using).filter(version=version).values_list("user_id", "at").first()
        self._gated = gated
        self._corrupt = corrupt
        self._erased = {user_id for user_id in _erased_query(using, version) if user_id in gated}
        self._left_log = {}
        self._log_from = version
        self._version = version
        self._generation = generation
        self._epoch = epoch
        self._fingerprint = _fingerprint(at_version)
        # The records were read after the clock, in statements of their own: they may hold
        # changes committed after ``version``. Read the clock again and replay the feed up to
        # it, so that the gate holds exactly the state at the version it reports (what the
        # signals' fences record, and the verifier checks against the history).
        with connections[using].cursor() as cursor:
            cursor.execute(_VERSION_SQL.format(table=LeaveClock._meta.db_table))
            (caught_up,) = cursor.fetchone()
        if caught_up > version:
            self._apply_feed(using, caught_up)
        self.warms += 1
        self.last_lag = 0
        self.last_warm_reason = reason
        self.last_warm_seconds = time.perf_counter() - started
        metrics.CACHE_WARM_SECONDS.observe(self.last_warm_seconds)
        logger.info(
            "leave cache warmed (%s): %d gated users at version %d generation %d in %.3fs",
            reason,
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
            .filter(version__gt=last, version__lte=version)
            .order_by("version")
            .values_list("version", "user_id", "value", "at", "action")
        )
        gated, corrupt, erased, log = self._gated, self._corrupt, self._erased, self._left_log
        fingerprint: Any = None
        for change_version, user_id, value, at, action in changes:
            record = deserialize_membership(user_id, value)
            if record is None or record.status == MembershipStatus.LEFT:
                gated.add(user_id)
                if action == _ERASE:
                    erased.add(user_id)
                log[user_id] = change_version
                if record is None:
                    corrupt.add(user_id)
                else:
                    corrupt.discard(user_id)
            else:
                gated.discard(user_id)
                corrupt.discard(user_id)
                erased.discard(user_id)
            last = change_version
            fingerprint = (user_id, at)
            self.feed_rows += 1
        if len(log) > settings.LEAVE_CACHE_REWARM_AFTER:
            # Bounded memory: older receipt fences are read from the history instead.
            self._left_log = {}
            self._log_from = last
        if last != self._version:
            self._version = last
            self._fingerprint = _fingerprint(fingerprint)


def _read_gated(using: str) -> tuple[BitMap64, set[int]]:
    """The gated ids (LEFT or corrupt records) and, apart, the corrupt ones.

    On PostgreSQL, in chunks by primary key, each chunk's ids packed by the database as one
    string of 8-byte integers (``int8send``): unpacked into an array and handed to the
    bitmap whole, so no Python int or tuple is made per id. Elsewhere (SQLite, the embedded
    default) row by row.
    """
    query = _gated_query(using).order_by("user_id").values("user_id", "record_status")
    connection = connections[using]
    gated = BitMap64()
    corrupt: set[int] = set()
    if connection.vendor != "postgresql":
        for user_id, status in query.values_list("user_id", "record_status").iterator(chunk_size=10_000):
            gated.add(user_id)
            if status == CORRUPT:
                corrupt.add(user_id)
        return gated, corrupt
    with connection.cursor() as cursor:
        # Chunks by ranges of ids of about _WARM_CHUNK records each (the planner's row
        # estimate), read in whatever order the database finds cheapest: no ORDER BY, no
        # LIMIT, so the scan costs what the floor's does and memory stays bounded.
        table = query.model._meta.db_table
        cursor.execute(
            f"SELECT min(user_id), max(user_id), (SELECT reltuples FROM pg_class WHERE oid = %s::regclass)"  # noqa: S608
            f" FROM {table}",
            [table],
        )
        low, high, estimate = cursor.fetchone()
        if low is None:
            return gated, corrupt
        chunks = max(1, math.ceil(max(estimate or 0, 1) / _WARM_CHUNK))
        width = (high - low) // chunks + 1
        for start in range(low, high + 1, width):
            sql, params = query.filter(user_id__gte=start, user_id__lt=start + width).order_by().query.sql_with_params()
            cursor.execute(
                f"SELECT string_agg(int8send(s.user_id), ''),"  # noqa: S608 - our own query's SQL
                f" array_agg(s.user_id) FILTER (WHERE s.record_status = %s) FROM ({sql}) s",
                [CORRUPT, *params],
            )
            packed, unreadable = cursor.fetchone()
            if packed is None:
                continue
            ids = array.array("Q")
            ids.frombytes(bytes(packed))
            if sys.byteorder == "little":
                ids.byteswap()  # int8send is big-endian
            gated.update(ids)
            corrupt.update(unreadable or ())
    return gated, corrupt


_ERASE = "erase"  # ChangeAction.ERASE (the models import this module)


def _erased_query(using: str, version: int) -> set[int]:
    """Users erased at or before ``version`` and not active again since (no later change to
    an active record): read through the partial index of erase rows."""
    from .models import LeaveHistory

    active_again = (
        LeaveHistory.objects.using(using)
        .annotate(record_status=RecordStatus("value"))
        .filter(
            user_id=models.OuterRef("user_id"),
            version__gt=models.OuterRef("version"),
            version__lte=version,
            record_status=MembershipStatus.ACTIVE,
        )
    )
    erases = LeaveHistory.objects.using(using).filter(action=_ERASE, version__lte=version)
    return set(erases.filter(~models.Exists(active_again)).values_list("user_id", flat=True))


def _fingerprint(row: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """A history row's identity, (user_id, at as naive UTC), however the backend returns it."""
    if row is None:
        return (None, None)
    user_id, at = row
    if isinstance(at, datetime) and at.tzinfo is not None:
        at = at.astimezone(UTC).replace(tzinfo=None)
    return (user_id, at)


def _fence_sql() -> str:
    from .models import LeaveClock, LeaveHistory

    return (
        f"SELECT c.version, c.generation, c.epoch, h.user_id, h.at FROM {LeaveClock._meta.db_table} c "  # noqa: S608
        f"LEFT JOIN {LeaveHistory._meta.db_table} h ON h.version = %s WHERE c.id = 1"
    )


_caches: weakref.WeakSet[LeaveCache] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # A child must not inherit a lock held by another thread at fork time; re-warming
    # in the child is the design's rule anyway (warm after fork).
    for cache in list(_caches):
        cache._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


def warm_after_worker_fork(**_: Any) -> None:
    """Celery ``worker_process_init``: start warming the new worker child in the background.

    Celery kills a child that is not up within its start-up timeout (4 s by default), and a
    warm of millions of gated users on a slow database can take longer: the child comes up at
    once and warms on a thread of its own. Its first batch waits on the cache's lock until
    the warm is done (or warms itself if this one failed), so nothing is gated early.
    """
    threading.Thread(target=_warm_now, name="leave-cache-warm", daemon=True).start()


def _warm_now() -> None:
    from .models import CommunityLeave

    try:
        CommunityLeave.objects.gate()
    except DatabaseError:
        # Not fatal: the first batch syncs again and retries until the database answers.
        logger.warning("leave cache could not warm at worker start; it warms on first use", exc_info=True)
    finally:
        connections.close_all()  # this thread's connections only
