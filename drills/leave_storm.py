"""Drill 5: a storm of concurrent leaves, rejoins and bulk leaves for the same users, from
several clients through several web processes. Afterwards each stored record equals its
user's last history entry, the history is a gap-free sequence of versions that ends at the
clock, and every process's cache equals the database."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

from drills import checks
from drills.deployment import Deployment


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(40_000, 40_030))
    statuses: Counter[str] = Counter()
    lock = threading.Lock()

    def storm(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            roll = rng.random()
            if roll < 0.1:
                body = {"user_ids": rng.sample(users, 10)}
                status, _ = client.request("POST", "/api/community-layer/bulk-leave/", body)
            else:
                action = "leave" if roll < 0.55 else "rejoin"
                status, _ = client.request("POST", f"/api/community-layer/{rng.choice(users)}/{action}/")
            with lock:
                statuses[str(status)] += 1

    with checks.Threads(storm, 6) as storming:
        storming.stopping.wait(60 if full else 10)

    mismatched = dep.sql(
        "SELECT l.user_id FROM community_communityleave l JOIN LATERAL ("
        " SELECT value FROM community_leavehistory h WHERE h.user_id = l.user_id ORDER BY version DESC LIMIT 1"
        ") last ON true WHERE last.value <> l.value"
    )
    without_history = dep.sql(
        "SELECT count(*) FROM community_communityleave l"
        " WHERE NOT EXISTS (SELECT 1 FROM community_leavehistory h WHERE h.user_id = l.user_id)"
    )[0][0]
    count, low, high = dep.sql("SELECT count(*), min(version), max(version) FROM community_leavehistory")[0]
    caches, caches_match = checks.caches(dep, client)
    result = {
        "requests": statuses.total(),
        "changes": count,
        "requests_per_second": round(statuses.total() / storming.seconds, 1),
        "records_equal_last_history": not mismatched and without_history == 0,
        "history_gap_free": count > 0 and (low, high) == (1, count) and high == dep.clock(),
        **caches,
        "statuses": dict(statuses),
    }
    result["passed"] = (
        result["records_equal_last_history"]
        and result["history_gap_free"]
        and caches_match
        and set(statuses) == {"200"}
    )
    return result
