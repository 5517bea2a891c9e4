"""Drill 2: kill -9 a Celery worker in the middle of batches while signals flow, then
restart it. Every accepted signal must end processed exactly once: the aggregates equal an
expectation computed from the accepted signals alone."""

from __future__ import annotations

import time
from dataclasses import dataclass

from drills.checks import LossResult, SignalLoad, check_nothing_lost, setup_targets, wait_until_processed
from drills.deployment import Deployment
from support.client import Client


@dataclass
class CrashResult(LossResult):
    kills: int
    killed_mid_batch: int


def _in_a_batch(dep: Deployment, name: str) -> bool:
    """Whether the worker has taken a batch it has not finished (from its log since it started)."""
    log = dep.log_since_start(name)
    return log.count("] received") > log.count("] succeeded in") + log.count("] retry:")


def drill(dep: Deployment, *, full: bool) -> CrashResult:
    client = Client(dep.url, dep.token)
    users = list(range(20_000, 20_300))
    targets = setup_targets(dep, client, users)
    total = 100_000 if full else 20_000
    kills = mid_batch = 0
    with SignalLoad(client, users, threads=3, batch=500, total=total) as load:
        deadline = time.monotonic() + (600 if full else 120)
        while len(load.sent) < total and time.monotonic() < deadline:
            time.sleep(0.7)
            name = f"worker{kills % dep.celery_workers}"
            for _ in range(100):  # wait (up to a second) for it to be in the middle of a batch
                if _in_a_batch(dep, name):
                    mid_batch += 1
                    break
                time.sleep(0.01)
            dep.kill(name)  # the whole worker: parent and children
            kills += 1
            time.sleep(0.5)
            dep.start_worker(int(name.removeprefix("worker")))
        load.wait(timeout=max(1.0, deadline - time.monotonic()))
    drain = wait_until_processed(dep, timeout=300)
    return CrashResult(
        kills=kills,
        killed_mid_batch=mid_batch,
        signals_per_second=round(len(load.sent) / load.seconds, 1),
        drain_seconds=round(drain, 1),
        checks=check_nothing_lost(dep, load, targets),
        http_errors={str(k): v for k, v in load.errors.items()},
    )
