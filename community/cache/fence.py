"""The process-local leave cache and its cross-process fence (see the package's docstring)."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Any

from django.conf import settings
from django.db import OperationalError, connections
from pyroaring import BitMap64

from tidalproject import metrics

from ..membership import MembershipStatus, deserialize_membership
from ..models import ChangeAction, LeaveHistory
from . import loader
from .gate import LeaveGate

logger = logging.getLogger(__name__)


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
            stored = set(loader.gated_query(using).values_list("user_id", flat=True))
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
                cursor.execute(loader.fence_sql(), [-1 if self._version is None else self._version])
                clock = cursor.fetchone()
            if clock is None:
                raise OperationalError("the leave clock row is missing: run migrate")
            version, generation, epoch, user_id, at = clock
            reason = self._warm_reason(version, generation, epoch, loader.fingerprint((user_id, at)))
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
        started = time.perf_counter()
        gated, corrupt = loader.read_gated(using)
        at_version = LeaveHistory.objects.using(using).filter(version=version).values_list("user_id", "at").first()
        self._gated = gated
        self._corrupt = corrupt
        self._erased = {user_id for user_id in loader.erased_users(using, version) if user_id in gated}
        self._left_log = {}
        self._log_from = version
        self._version = version
        self._generation = generation
        self._epoch = epoch
        self._fingerprint = loader.fingerprint(at_version)
        # The records were read after the clock, in statements of their own: they may hold
        # changes committed after ``version``. Read the clock again and replay the feed up to
        # it, so that the gate holds exactly the state at the version it reports (what the
        # signals' fences record, and the verifier checks against the history).
        with connections[using].cursor() as cursor:
            cursor.execute(loader.clock_version_sql())
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
                if action == ChangeAction.ERASE:
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
            self._fingerprint = loader.fingerprint(fingerprint)


_caches: weakref.WeakSet[LeaveCache] = weakref.WeakSet()


def _reset_after_fork() -> None:
    # A child must not inherit a lock held by another thread at fork time; re-warming
    # in the child is the design's rule anyway (warm after fork).
    for cache in list(_caches):
        cache._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
