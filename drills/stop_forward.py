"""Drill 1: the stop-forward race.

Load generators keep posting signals for members of communities and cohorts while other
clients make the same users leave and rejoin, each request on a new connection, so that
gunicorn spreads them over its web processes. For every signal posted after a leave was
answered and before the next rejoin was sent, the outcome must be gated, and the
aggregates must equal what the attributed signals alone add up to.

"Posted" is the whole POST: sent after the leave's answer came back, answered (202) before
the rejoin was sent. A POST still in flight when the rejoin is sent may reach the server
after the rejoin, and nothing on the server can tell when the client meant it.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from drills.checks import (
    SignalLoad,
    actual_aggregates,
    expected_aggregates,
    outcomes,
    setup_targets,
    wait_until_processed,
)
from drills.deployment import Deployment
from support.client import Client

GATED, ATTRIBUTED = 2, 1


@dataclass
class Window:
    """A user's left period as a client saw it: from the leave's answer to the rejoin's send."""

    user_id: int
    left_answered: float
    rejoin_sent: float = float("inf")


@dataclass
class RaceResult:
    seconds: float
    leaves: int
    signals_posted: int
    signals_per_second: float
    must_be_gated: int
    violations: int
    aggregates_match: bool
    outcomes: dict[str, int] = field(default_factory=dict)
    http_errors: int = 0

    @property
    def passed(self) -> bool:
        return (
            self.violations == 0
            and self.aggregates_match
            and self.outcomes.get("pending", 0) == 0
            and self.http_errors == 0
        )


def run(dep: Deployment, *, seconds: float, users: int = 40, posters: int = 2, togglers: int = 3) -> RaceResult:
    client = Client(dep.url, dep.token)
    user_ids = list(range(10_000, 10_000 + users))
    targets = setup_targets(dep, client, user_ids)
    stop = threading.Event()
    windows: list[Window] = []
    errors = Counter[str]()
    lock = threading.Lock()
    load = SignalLoad(client, user_ids, threads=posters)

    def toggle(own: list[int], seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            user_id = rng.choice(own)
            status, body = client.request("POST", f"/api/community-layer/{user_id}/leave/")
            answered = time.monotonic()
            if status != 200 or body["status"] != "left":
                errors[f"leave {status}"] += 1
                continue
            window = Window(user_id, answered)
            with lock:
                windows.append(window)
            time.sleep(rng.uniform(0.01, 0.15))
            window.rejoin_sent = time.monotonic()
            status, body = client.request("POST", f"/api/community-layer/{user_id}/rejoin/")
            if status != 200:
                errors[f"rejoin {status}"] += 1
                stop.wait(0.5)  # the user may still be left: later windows overlap it harmlessly
            time.sleep(rng.uniform(0.0, 0.05))

    shares = [user_ids[i::togglers] for i in range(togglers)]
    threads = [threading.Thread(target=toggle, args=(shares[i], 100 + i)) for i in range(togglers)]
    with load:
        for thread in threads:
            thread.start()
        stop.wait(seconds)
        stop.set()
        for thread in threads:
            thread.join(60)
    elapsed = load.seconds
    sent = load.sent
    wait_until_processed(dep)

    by_user: dict[int, list[Window]] = {}
    for window in windows:
        by_user.setdefault(window.user_id, []).append(window)
    stored = outcomes(dep)
    must_be_gated = violations = 0
    for signal in sent:
        answered = load.answered[signal.key]
        inside = any(
            w.left_answered <= signal.posted_at and answered < w.rejoin_sent for w in by_user.get(signal.user_id, [])
        )
        if inside:
            must_be_gated += 1
            if stored.get(signal.key) != GATED:
                violations += 1
    attributed = [s for s in sent if stored.get(s.key) == ATTRIBUTED]
    counts = Counter(stored.values())
    return RaceResult(
        seconds=elapsed,
        leaves=len(windows),
        signals_posted=len(sent),
        signals_per_second=len(sent) / elapsed,
        must_be_gated=must_be_gated,
        violations=violations + sum(1 for s in sent if s.key not in stored),
        aggregates_match=actual_aggregates(dep) == expected_aggregates(attributed, targets),
        outcomes={"attributed": counts[ATTRIBUTED], "gated": counts[GATED], "pending": counts[0]},
        http_errors=sum(errors.values()) + sum(load.errors.values()),
    )


def drill(dep: Deployment, *, full: bool) -> RaceResult:
    """Short: 10 seconds. Full: until at least 1,000 leaves (about 80 seconds here)."""
    if not full:
        return run(dep, seconds=10)
    return run(dep, seconds=90)
