"""The broker loses its messages mid-run: its database flushed, then the Redis server stopped and started
again (it keeps nothing on disk). The sweep re-enqueues what was pending: nothing lost or counted twice."""

from __future__ import annotations

import time
from typing import Any

import redis

from drills import checks
from drills.deployment import Deployment, start_redis, stop_redis


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(30_000, 30_200))
    targets = checks.setup_targets(dep, client, users)
    rounds, down = (3, 5.0) if full else (1, 3.0)
    with checks.SignalLoad(client, users, threads=2, batch=200) as load:
        for _ in range(rounds):
            time.sleep(3)
            redis.Redis.from_url(dep.broker_url).flushdb()  # every queued message is gone
            time.sleep(3)
            stop_redis()  # the server goes away, and with it everything it held
            time.sleep(down)
            start_redis()
        time.sleep(3)
    result, passed = checks.loss_figures(dep, load, targets)
    return {**result, "flushes": rounds, "restarts": rounds, "redis_down_seconds": down, "passed": passed}
