"""Drill 2: kill -9 a Celery worker in the middle of batches while signals flow, then
restart it. Every accepted signal must end processed exactly once: the aggregates equal an
expectation computed from the accepted signals alone."""

from __future__ import annotations

import time
from dataclasses import dataclass

from drills import checks
from drills.deployment import Deployment


@dataclass
class CrashResult(checks.LossResult):
    kills: int
    killed_mid_batch: int


def _in_a_batch(dep: Deployment, name: str) -> bool:
    """Whether the worker has taken a batch it has not finished (from its log since it started)."""
    log = dep.log_since_start(name)
    return log.count("] received") > log.count("] succeeded in") + log.count("] retry:")


def drill(dep: Deployment, *, full: bool) -> CrashResult:
    client, users = dep.client(), list(range(20_000, 20_300))
    targets = checks.setup_targets(dep, client, users)
    total = 100_000 if full else 20_000
    kills = mid_batch = 0
    with checks.SignalLoad(client, users, threads=3, batch=500, total=total) as load:
        deadline = time.monotonic() + (600 if full else 120)
        while len(load.sent) < total and time.monotonic() < deadline:
            time.sleep(0.7)
            name = f"worker{kills % dep.celery_workers}"
            for _ in range(100):  # wait (up to a second) for it to be in the middle of a batch
                if _in_a_batch(dep, name):
                    mid_batch += 1
                    break
                time.sleep(0.01)
            dep.crash(name)
            kills += 1
        load.wait(timeout=max(1.0, deadline - time.monotonic()))
    drain = checks.wait_until_processed(dep, timeout=300)
    lost = checks.check_nothing_lost(dep, load, targets)
    return CrashResult(load.rate, round(drain, 1), lost, load.error_counts(), kills=kills, killed_mid_batch=mid_batch)
