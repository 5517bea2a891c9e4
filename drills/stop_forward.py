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

from drills import checks
from drills.deployment import Deployment

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
            not self.violations and self.aggregates_match and not self.outcomes.get("pending") and not self.http_errors
        )


def run(dep: Deployment, *, seconds: float, users: int = 40, posters: int = 2, togglers: int = 3) -> RaceResult:
    client = dep.client()
    user_ids = list(range(10_000, 10_000 + users))
    targets = checks.setup_targets(dep, client, user_ids)
    windows: list[Window] = []
    errors = Counter[str]()
    lock = threading.Lock()

    def toggle(index: int, stop: threading.Event) -> None:
        rng, own = random.Random(100 + index), user_ids[index::togglers]
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

    with checks.SignalLoad(client, user_ids, threads=posters) as load, checks.Threads(toggle, togglers) as toggling:
        toggling.stopping.wait(seconds)
    sent = load.sent
    checks.wait_until_processed(dep)

    by_user: dict[int, list[Window]] = {}
    for window in windows:
        by_user.setdefault(window.user_id, []).append(window)
    stored = checks.outcomes(dep)
    must_be_gated = violations = 0
    for signal in sent:
        answered = load.answered[signal.key]
        if any(
            w.left_answered <= signal.posted_at and answered < w.rejoin_sent for w in by_user.get(signal.user_id, [])
        ):
            must_be_gated += 1
            violations += stored.get(signal.key) != GATED
    attributed = [s for s in sent if stored.get(s.key) == ATTRIBUTED]
    counts = Counter(stored.values())
    return RaceResult(
        seconds=load.seconds,
        leaves=len(windows),
        signals_posted=len(sent),
        signals_per_second=len(sent) / load.seconds,
        must_be_gated=must_be_gated,
        violations=violations + sum(1 for s in sent if s.key not in stored),
        aggregates_match=checks.actual_aggregates(dep) == checks.expected_aggregates(attributed, targets),
        outcomes={"attributed": counts[ATTRIBUTED], "gated": counts[GATED], "pending": counts[0]},
        http_errors=sum(errors.values()) + sum(load.errors.values()),
    )


def drill(dep: Deployment, *, full: bool) -> RaceResult:
    """Short: 10 seconds. Full: 90 seconds (at least 1,000 leaves here)."""
    return run(dep, seconds=90 if full else 10)
