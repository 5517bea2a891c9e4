"""PostgreSQL goes down mid-run and comes back: while it is down the API answers 503 with a JSON body (never
a 500 or a stack trace) and the workers, unable to read the fence, process nothing and retry. Afterwards every
accepted signal is processed once, a left user's signals are all gated, every process's cache equals the records."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from drills import checks
from drills.deployment import Deployment, postgres_ctl


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(50_000, 50_100))
    targets = checks.setup_targets(dep, client, users)
    left_user = users[0]
    status, _ = client.request("POST", f"/api/community-layer/{left_user}/leave/")
    assert status == 200
    down = 10.0 if full else 5.0
    during: Counter[str] = Counter()
    json_bodies = True
    outsider = 99_000_000  # probes use a user with no memberships: whatever they do moves no aggregate
    with checks.SignalLoad(client, users, threads=2, batch=200) as load:
        time.sleep(3)
        outage = threading.Thread(target=lambda: (postgres_ctl("stop"), time.sleep(down), postgres_ctl("start")))
        outage.start()
        time.sleep(1.5)
        while outage.is_alive():
            for method, path, body in (
                ("GET", f"/api/community-layer/{users[1]}/", None),
                ("POST", "/api/signals/", {"signals": [{"user_id": outsider, "item_id": 1, "kind": "like"}]}),
                ("POST", f"/api/community-layer/{outsider}/leave/", None),
            ):
                status, answer = client.request(method, path, body)
                during[str(status)] += 1
                if status == 503 and not (isinstance(answer, dict) and "detail" in answer):
                    json_bodies = False
            time.sleep(0.3)
        outage.join()
        time.sleep(3)  # load goes on after the database is back
    checks.wait_until_processed(dep)
    stored = checks.outcomes(dep)
    left_signals = [s for s in load.sent if s.user_id == left_user]
    lost, nothing_lost = checks.nothing_lost(dep, load.sent, {u: t for u, t in targets.items() if u != left_user})
    caches, caches_match = checks.caches(dep, client)
    result = {
        "down_seconds": down,
        "during_outage": dict(during),
        "bodies_json_with_detail": json_bodies,
        "left_user_signals": len(left_signals),
        "left_user_not_gated": sum(1 for s in left_signals if stored.get(s.key) != checks.GATED),
        "checks": lost,
        **caches,
        "load_errors": dict(load.errors),
    }
    statuses = set(during) | set(load.errors)
    result["passed"] = bool(
        nothing_lost
        and result["left_user_not_gated"] == 0
        and json_bodies
        and "503" in during
        and not any(s.startswith("5") and s != "503" for s in statuses)
        and caches_match
    )
    return result
