"""A storm of concurrent leaves, rejoins and bulk leaves of the same users through several web processes:
each record must equal its last history entry, the history be gap-free up to the clock, every cache match."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

from drills import checks
from drills.deployment import Deployment


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(40_000, 40_030))
    statuses: list[int] = []  # of every request (list.append is atomic)

    def storm(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            roll = rng.random()
            if roll < 0.1:
                path, body = "/api/community-layer/bulk-leave/", {"user_ids": rng.sample(users, 10)}
            else:
                path, body = f"/api/community-layer/{rng.choice(users)}/{'leave' if roll < 0.55 else 'rejoin'}/", None
            statuses.append(client.request("POST", path, body)[0])

    with checks.Threads(storm, 6) as storming:
        storming.stopping.wait(60 if full else 10)

    unequal = dep.sql(  # a record without history counts too: its last entry is NULL
        "SELECT count(*) FROM community_communityleave l WHERE l.value IS DISTINCT FROM"
        " (SELECT value FROM community_leavehistory h WHERE h.user_id = l.user_id ORDER BY version DESC LIMIT 1)"
    )[0][0]
    count, low, high = dep.sql("SELECT count(*), min(version), max(version) FROM community_leavehistory")[0]
    caches, caches_match = checks.caches(dep, client)
    gap_free = count > 0 and (low, high) == (1, count) and high == dep.clock()
    return {
        "requests": len(statuses),
        "changes": count,
        "requests_per_second": round(len(statuses) / storming.seconds, 1),
        "records_equal_last_history": unequal == 0,
        "history_gap_free": gap_free,
        **caches,
        "statuses": {str(status): n for status, n in Counter(statuses).items()},
        "passed": unequal == 0 and gap_free and caches_match and set(statuses) == {200},
    }
