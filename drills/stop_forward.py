"""The stop-forward race (``stop_forward_pooled``: the same through PgBouncer), each request on a new
connection so that gunicorn spreads them over its web processes."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from drills import checks
from drills.checks import ATTRIBUTED, GATED
from drills.deployment import Deployment


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    seconds, togglers = (90 if full else 10), 3  # full: at least 1,000 leaves here
    client, user_ids = dep.client(), list(range(10_000, 10_040))
    targets = checks.setup_targets(dep, client, user_ids)
    # Each user's left periods as the clients saw them: [the leave's answer, the rejoin's send].
    windows: dict[int, list[list[float]]] = {u: [] for u in user_ids}
    errors: list[str] = []  # (list.append is atomic)

    def toggle(index: int, stop: threading.Event) -> None:
        rng, own = random.Random(100 + index), user_ids[index::togglers]
        while not stop.is_set():
            user_id = rng.choice(own)
            status, body = client.request("POST", f"/api/community-layer/{user_id}/leave/")
            window = [time.monotonic(), float("inf")]
            if status != 200 or body["status"] != "left":
                errors.append(f"leave {status}")
                continue
            windows[user_id].append(window)
            time.sleep(rng.uniform(0.01, 0.15))
            window[1] = time.monotonic()
            status, body = client.request("POST", f"/api/community-layer/{user_id}/rejoin/")
            if status != 200:
                errors.append(f"rejoin {status}")
                stop.wait(0.5)  # the user may still be left: later windows overlap it harmlessly
            time.sleep(rng.uniform(0.0, 0.05))

    with checks.SignalLoad(client, user_ids, threads=2) as load, checks.Threads(toggle, togglers) as toggling:
        toggling.stopping.wait(seconds)
    checks.wait_until_processed(dep)

    stored = checks.outcomes(dep)
    # Must be gated: the whole POST inside a window, sent after the leave's answer and answered (202) before
    # the rejoin was sent. One still in flight at the rejoin may reach the server after it, and nothing on
    # the server can tell when the client meant it.
    gated = [
        s
        for s in load.sent
        if any(left <= s.posted_at and load.answered[s.key] < rejoin for left, rejoin in windows[s.user_id])
    ]
    violations = sum(stored.get(s.key) != GATED for s in gated) + sum(s.key not in stored for s in load.sent)
    attributed = [s for s in load.sent if stored.get(s.key) == ATTRIBUTED]
    counts = Counter(stored.values())
    result = {
        "seconds": load.seconds,
        "leaves": sum(map(len, windows.values())),
        "signals_posted": len(load.sent),
        "signals_per_second": load.rate,
        "must_be_gated": len(gated),
        "violations": violations,
        "aggregates_match": checks.actual_aggregates(dep) == checks.expected_aggregates(attributed, targets),
        "outcomes": {"attributed": counts[ATTRIBUTED], "gated": counts[GATED], "pending": counts[0]},
        "http_errors": len(errors) + load.errors.total(),
    }
    result["passed"] = not violations and result["aggregates_match"] and not counts[0] and not result["http_errors"]
    return result
