"""A backlog longer than the sweep threshold, and no sweep storm: with the workers paused, the sweep (run
every SIGNAL_SWEEP_EVERY_SECONDS by hand, as the paused workers would not take beat's task) must send no
queued signal's task again, and after the drain find nothing to do."""

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
    enqueued = sweeps = deferred = 0
    started = time.monotonic()
    with dep.workers_paused(), checks.SignalLoad(client, users, threads=1, batch=50) as load:
        while time.monotonic() - started < seconds:
            time.sleep(float(dep.env["SIGNAL_SWEEP_EVERY_SECONDS"]))
            sent, deferred = _sweep(dep)
            enqueued += sent
            sweeps += 1
    backlog = round(time.monotonic() - started, 1)
    drain = checks.wait_until_processed(dep, timeout=600)
    after, _ = _sweep(dep)
    accepted = len(load.sent)
    lost, nothing_lost = checks.nothing_lost(dep, load.sent, targets)
    return {
        "backlog_seconds": backlog,
        "sweeps": sweeps,
        "enqueued_by_sweeps": enqueued,
        "deferred_by_last_sweep": deferred,
        "tasks_enqueued_per_signal": round((accepted + enqueued) / max(accepted, 1), 3),
        "drain_seconds": drain,
        "sweep_after_drain": after,
        "checks": lost,
        "passed": sweeps >= 2 and not enqueued and deferred > 0 and not after and nothing_lost,
    }
