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
import threading
from typing import Any

from django.db import DatabaseError, connections

from .fence import LeaveCache
from .gate import LeaveGate

logger = logging.getLogger(__name__)

# This process's leave cache: every gate of the process reads the same one.
leave_cache = LeaveCache()


def leave_gate(using: str = "default") -> LeaveGate:
    """Sync the fence and return the gate: call once per batch, then look up freely."""
    return leave_cache.sync(using)


def warm_after_worker_fork(**_: Any) -> None:
    """Celery ``worker_process_init``: start warming the new worker child in the background.

    Celery kills a child that is not up within its start-up timeout (4 s by default), and a
    warm of millions of gated users on a slow database can take longer: the child comes up at
    once and warms on a thread of its own. Its first batch waits on the cache's lock until
    the warm is done (or warms itself if this one failed), so nothing is gated early.
    """
    threading.Thread(target=_warm_now, name="leave-cache-warm", daemon=True).start()


def _warm_now() -> None:
    try:
        leave_gate()
    except DatabaseError:
        # Not fatal: the first batch syncs again and retries until the database answers.
        logger.warning("leave cache could not warm at worker start; it warms on first use", exc_info=True)
    finally:
        connections.close_all()  # this thread's connections only
