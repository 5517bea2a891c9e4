"""kill -9 a Celery worker in the middle of batches while signals flow, then start it again: every accepted
signal must end processed exactly once (the aggregates equal an expectation from the accepted signals alone)."""

from __future__ import annotations

import time
from typing import Any

from drills import checks
from drills.deployment import Deployment


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(20_000, 20_300))
    targets = checks.setup_targets(dep, client, users)
    kills = mid_batch = 0
    with checks.SignalLoad(client, users, threads=3, batch=500, total=100_000 if full else 20_000) as load:
        deadline = time.monotonic() + (600 if full else 120)
        while not load.done() and time.monotonic() < deadline:
            time.sleep(0.7)
            name = f"worker{kills % dep.celery_workers}"
            for _ in range(100):  # up to a second for its log to show a batch taken and not finished
                if dep.mid_task(name):
                    mid_batch += 1
                    break
                time.sleep(0.01)
            dep.crash(name)
            kills += 1
    result, passed = checks.loss_figures(dep, load, targets)
    return {**result, "kills": kills, "killed_mid_batch": mid_batch, "passed": passed}
