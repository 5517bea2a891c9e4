"""Drill 3: the broker loses its messages mid-run: first its database is flushed, then the
Redis server is stopped and started again (it keeps nothing on disk). The sweep re-enqueues
what was pending; nothing is lost and nothing is counted twice."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from drills.checks import LossResult, SignalLoad, check_nothing_lost, setup_targets, wait_until_processed
from drills.deployment import Deployment, start_redis, stop_redis
from support.client import Client


@dataclass
class BrokerLossResult(LossResult):
    flushes: int
    restarts: int
    redis_down_seconds: float


def drill(dep: Deployment, *, full: bool) -> BrokerLossResult:
    client = Client(dep.url, dep.token)
    users = list(range(30_000, 30_200))
    targets = setup_targets(dep, client, users)
    rounds = 3 if full else 1
    down = 5.0 if full else 3.0
    flushes = restarts = 0
    with SignalLoad(client, users, threads=2, batch=200) as load:
        for _ in range(rounds):
            time.sleep(3)
            redis.Redis.from_url(dep.broker_url).flushdb()  # every queued message is gone
            flushes += 1
            time.sleep(3)
            stop_redis()  # the server goes away, and with it everything it held
            time.sleep(down)
            start_redis()
            restarts += 1
        time.sleep(3)
    drain = wait_until_processed(dep, timeout=300)
    return BrokerLossResult(
        flushes=flushes,
        restarts=restarts,
        redis_down_seconds=down,
        signals_per_second=round(len(load.sent) / load.seconds, 1),
        drain_seconds=round(drain, 1),
        checks=check_nothing_lost(dep, load, targets),
        http_errors={str(k): v for k, v in load.errors.items()},
    )
