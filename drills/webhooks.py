"""Webhooks that lose nothing, to two loopback receivers (one answers 500 to about half
the deliveries, the other is down for 30 s) while clients storm leaves and rejoins and a Celery
worker is killed once (what must hold is in the README's table)."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from drills import checks
from drills.deployment import Deployment
from support.processes import wait_until
from support.receiver import serve

DOWN_SECONDS = 30.0


class Receiver:
    """A loopback HTTP receiver that verifies every message and records what it accepted."""

    def __init__(self, name: str, *, fail_ratio: float = 0.0) -> None:
        self.name, self.fail_ratio, self.rng = name, fail_ratio, random.Random(7)
        self.secret = ""
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter(messages=0, answered_500=0, bad_signatures=0, max_concurrent_requests=0)
        self.in_flight = 0
        self.accepted: list[list[dict[str, Any]]] = []  # the changes of each 2xx-answered message
        self.port = 0
        self.start()

    def receive(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            self.in_flight += 1
            self.counts["max_concurrent_requests"] = max(self.counts["max_concurrent_requests"], self.in_flight)
            self.counts["messages"] += 1
        try:
            payload = Webhook(self.secret).verify(body, headers)
        except WebhookVerificationError:
            payload = None
        with self.lock:
            self.in_flight -= 1
            if payload is None:
                self.counts["bad_signatures"] += 1
                return 400
            if self.rng.random() < self.fail_ratio:
                self.counts["answered_500"] += 1
                return 500
            self.accepted.append(payload["data"]["changes"])
            return 204

    def start(self) -> None:
        self.server = serve(self.receive, port=self.port)
        self.port = self.server.server_address[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def check(self, history: dict[int, tuple[int, str, str]]) -> dict[str, Any]:
        """Replay what was accepted as a consumer that stores the last version it applied."""
        applied = 0
        found: Counter[str] = Counter(duplicates=0, out_of_order=0, wrong_content=0)
        for change in (change for changes in self.accepted for change in changes):
            version = change["version"]
            if version <= applied:
                found["duplicates"] += 1
                continue
            found["out_of_order"] += version != applied + 1
            found["wrong_content"] += history.get(version) != (change["user_id"], change["action"], change["reason"])
            applied = version
        return {**self.counts, "applied_up_to": applied, **found}


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    perms = ("add_webhooksubscription", "view_webhooksubscription", "change_communityleave", "view_communityleave")
    client = dep.service_client("drill-hooks", *(f"community.{perm}" for perm in perms))
    receivers = [Receiver("flaky_500_half", fail_ratio=0.5), Receiver("down_30s")]
    down = receivers[1]
    for receiver in receivers:
        subscription = {"name": receiver.name, "url": f"http://127.0.0.1:{receiver.port}/hook", "after": 0}
        status, body = client.request("POST", "/api/webhooks/", subscription)
        if status != 201:
            raise RuntimeError(f"subscription refused: {status} {body}")
        receiver.secret = body["secret"]

    target_changes = 5_000 if full else 1_000
    statuses: list[int] = []  # of every request (list.append is atomic)

    def storm(seed: int, stop: threading.Event) -> None:
        rng = random.Random(seed)
        # Each client toggles users of its own, so (nearly) every request is a change.
        left: set[int] = set()
        mine = range(70_000 + seed * 1_000, 70_000 + seed * 1_000 + 50)
        while not stop.is_set():
            user = rng.choice(mine)
            action = "rejoin" if user in left else "leave"
            left ^= {user}
            status, _ = client.request(
                "POST", f"/api/community-layer/{user}/{action}/", {"reason": f"drill {seed}-{rng.randrange(1000)}"}
            )
            statuses.append(status)

    with checks.Threads(storm, 4) as storming:
        # The second receiver goes down early in the storm for DOWN_SECONDS, then comes back on its port;
        # halfway, the whole of worker0 is killed with -9, then started again.
        time.sleep(2)
        down.stop()
        down_at, down_seconds, killed = time.monotonic(), 0.0, False
        while not down_seconds or not storming.stopping.is_set():
            clock = dep.clock()
            if not killed and clock >= target_changes // 2:
                dep.crash("worker0", down=1)
                killed = True
            if not down_seconds and time.monotonic() - down_at >= DOWN_SECONDS:
                down.start()
                down_seconds = round(time.monotonic() - down_at, 1)
            if clock >= target_changes:
                storming.stopping.set()
            time.sleep(0.2)
    changes, requests = dep.clock(), len(statuses)

    # Everyone catches up: each subscriber's acknowledged version reaches the clock.
    catch_up_started = time.monotonic()
    query = "SELECT name, acked_version FROM community_webhooksubscription"
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: all(v >= changes for _, v in dep.sql(query)), timeout=600 if full else 150, what="acks")
    catch_up = round(time.monotonic() - catch_up_started, 1)
    acked = dict(dep.sql(query))
    time.sleep(1)  # let the last answers be recorded

    rows = dep.sql("SELECT version, user_id, action, reason FROM community_leavehistory")
    history = {v: (u, a, r) for v, u, a, r in rows}
    for receiver in receivers:
        receiver.stop()
    subscribers = {r.name: r.check(history) for r in receivers}
    passed = (
        changes > 0
        and set(statuses) == {200}
        and all(
            s["applied_up_to"] == changes
            and not (s["out_of_order"] or s["wrong_content"] or s["bad_signatures"])
            and s["max_concurrent_requests"] == 1
            for s in subscribers.values()
        )
        and all(v == changes for v in acked.values())
    )
    return {
        "requests": requests,
        "changes": changes,
        "requests_per_second": round(requests / storming.seconds, 1),
        "worker_kills": int(killed),
        "receiver_down_seconds": down_seconds,
        "catch_up_seconds": catch_up,
        "subscribers": subscribers,
        "acked_versions": acked,
        "statuses": {str(status): n for status, n in Counter(statuses).items()},
        "passed": passed,
    }
