"""Drill 8: a backlog longer than the sweep threshold, and no sweep storm.

The workers are paused (SIGSTOP: they keep their state and take no work) while clients keep
posting signals for longer than SIGNAL_SWEEP_AFTER_SECONDS, and the sweep runs as beat would
(every SIGNAL_SWEEP_EVERY_SECONDS, in a process of its own, since the paused workers would
not take beat's task). Every signal's task is still in the queue, so the sweep must send
none again. Then the workers resume and drain the queue; the tasks enqueued per signal are
reported. Afterwards a sweep finds nothing to do, and nothing was lost or counted twice.
"""

from __future__ import annotations

import re
import time
from typing import Any

from drills import checks
from drills.deployment import Deployment

SWEEP_LINE = re.compile(r"enqueued (\d+) pending signal\(s\)(?:; (\d+) left alone)?")


def _sweep(dep: Deployment) -> tuple[int, int]:
    match = SWEEP_LINE.search(dep.manage("requeue_pending_signals"))
    assert match, "the sweep said nothing recognisable"
    return int(match[1]), int(match[2] or 0)


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(70_000, 70_040))
    targets = checks.setup_targets(dep, client, users)
    seconds = 300.0 if full else 20.0
    every = float(dep.env["SIGNAL_SWEEP_EVERY_SECONDS"])
    enqueued = sweeps = deferred = 0
    for name in dep.workers():
        dep.pause(name)
    started = time.monotonic()
    try:
        with checks.SignalLoad(client, users, threads=1, batch=50) as load:
            while time.monotonic() - started < seconds:
                time.sleep(every)
                sent, deferred = _sweep(dep)
                enqueued += sent
                sweeps += 1
    finally:
        for name in dep.workers():
            dep.resume(name)
    backlog = round(time.monotonic() - started, 1)
    drain = checks.wait_until_processed(dep, timeout=600)
    after, _ = _sweep(dep)
    accepted = len(load.sent)
    lost = checks.check_nothing_lost(dep, load, targets)
    return {
        "backlog_seconds": backlog,
        "sweeps": sweeps,
        "enqueued_by_sweeps": enqueued,
        "deferred_by_last_sweep": deferred,
        "tasks_enqueued_per_signal": round((accepted + enqueued) / max(accepted, 1), 3),
        "drain_seconds": drain,
        "sweep_after_drain": after,
        "checks": lost,
        "passed": sweeps >= 2 and not enqueued and deferred > 0 and not after and checks.nothing_lost(lost),
    }
