"""The gate a sync returns: in-memory look-ups at one fence position, no query per signal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..membership import MembershipStatus
from ..models import LeaveHistory
from ..record_status import RecordStatus

if TYPE_CHECKING:
    from .fence import LeaveCache


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

    def left_among(self, user_ids: Sequence[int], since: Sequence[int]) -> list[bool]:
        """``is_left(user_ids[i], since=since[i])`` for each signal of a batch, without a call
        a signal: the while-queued check runs only for the users with a change in memory
        after their receipt (or none loaded, which fails closed as ``is_left`` does)."""
        cache = self._cache
        gated, version, log_from = cache._gated, self.version, cache._log_from
        # The batch's users with a left change in the feed log or the loaded history.
        users = set(user_ids)
        suspects = users.intersection(cache._left_log)
        if self._history:
            suspects |= users.intersection(self._history)
        if not suspects and (not since or min(since) >= log_from):
            # The usual batch: memory shows no left change after any receipt, so the answer is
            # the bitmap's alone (what the general form below gives, without its tests).
            return [user_id in gated for user_id in user_ids]
        return [
            user_id in gated
            or (
                since_version < version
                and (user_id in suspects or since_version < log_from)
                and self._left_after(user_id, since_version)
            )
            for user_id, since_version in zip(user_ids, since, strict=True)
        ]

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
