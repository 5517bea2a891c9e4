"""Drill 7: a restore under the running deployment moves the leave clock backwards.

pg_dump at version V; more leaves, which every web and worker process syncs to (their
caches are at V + k); the dump restored with pg_restore under the running processes; then a
leave. Every process must gate that user at once, though the clock now reads V + 1, below the
version they cached. Workers are paused with signals queued for that user while the leave is
made, so the first thing each does afterwards is gate with its old cache. Then enough leaves
to overtake the cached version (the case only the history row at that version can tell), and
every cache must equal the records.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from drills import checks
from drills.checks import GATED
from drills.deployment import Deployment
from support.client import Client


def _leave(client: Client, user_id: int, errors: list[str]) -> int:
    status, body = client.request("POST", f"/api/community-layer/{user_id}/leave/")
    if status != 200:
        errors.append(f"leave {user_id}: {status}")
        return -1
    return int(body["version"])


def _post(client: Client, user_id: int, count: int, errors: list[str]) -> list[str]:
    """``count`` keyed signals for ``user_id``, one request each (spread over the web processes)."""
    keys = []
    for _ in range(count):
        key = uuid.uuid4().hex
        signal = {"user_id": user_id, "item_id": 1, "kind": "view", "idempotency_key": key}
        signal["occurred_at"] = datetime.now(UTC).isoformat()
        status, _ = client.request("POST", "/api/signals/", {"signals": [signal]})
        if status == 202:
            keys.append(key)
        else:
            errors.append(f"signals {status}")
    return keys


def _gated(dep: Deployment, keys: list[str]) -> int:
    query = "SELECT count(*) FROM signals_app_signal WHERE idempotency_key = ANY(%s) AND outcome = %s"
    return int(dep.sql(query, [keys, GATED])[0][0])


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(60_000, 60_000 + (60 if full else 30)))
    checks.setup_targets(dep, client, users)
    errors: list[str] = []
    before, after, rest = users[:5], users[5:15], users[15:]
    for user_id in before:
        _leave(client, user_id, errors)
    dump_version = dep.clock()
    dump = dep.logs / "restore-drill.dump"
    subprocess.run(["pg_dump", "--format=custom", f"--file={dump}", dep.database_url], check=True, timeout=120)
    for user_id in after:
        _leave(client, user_id, errors)
    # Every process syncs to the clock after the dump (each answers with its cache's version).
    web = checks.web_caches(client, samples=16)
    workers = checks.worker_caches(dep)
    cached = dep.clock()

    restore = ["pg_restore", "--clean", "--if-exists", "--single-transaction", f"--dbname={dep.database_url}"]
    subprocess.run([*restore, str(dump)], check=True, timeout=300, capture_output=True)
    # Workers paused with signals queued for the next leaver: when they resume, they gate
    # with the cache they had, fenced by the restored clock.
    leaver = rest[0]
    for name in dep.workers():
        dep.pause(name)
    try:
        queued = _post(client, leaver, 12, errors)
        first = _leave(client, leaver, errors)
        received = _post(client, leaver, 24, errors)
    finally:
        for name in dep.workers():
            dep.resume(name)
    # Overtake: more leaves than the versions lost, so the clock passes what processes cached.
    overtakers = rest[1 : 1 + len(after) + 2]
    for user_id in overtakers:
        _leave(client, user_id, errors)
    overtaken = [key for user_id in overtakers for key in _post(client, user_id, 2, errors)]
    checks.wait_until_processed(dep, timeout=120)
    time.sleep(0.5)
    reasons: Counter[str] = Counter()
    for name in ["web", *dep.workers()]:
        for line in dep.log_since_start(name).splitlines():
            if "leave cache warmed (" in line and "first use" not in line:
                reason = line.split("leave cache warmed (", 1)[1].split(")", 1)[0]
                reason = "clock went back" if reason.startswith("clock went back") else reason
                reasons["history rewritten" if reason.startswith("history at version") else reason] += 1
    result: dict[str, Any] = {
        "dump_version": dump_version,
        "cached_version_before_restore": cached,
        "processes": len(web) + len(workers),
        "version_after_first_leave": first,
    }
    every_gated = True
    for kind, keys in (("queued", queued), ("received", received), ("overtaken", overtaken)):
        result[f"{kind}_gated"], result[f"{kind}_total"] = _gated(dep, keys), len(keys)
        every_gated = every_gated and result[f"{kind}_gated"] == len(keys) > 0
    caches, caches_match = checks.caches(dep, client, samples=16)
    result.update(warm_reasons=dict(reasons), **caches, errors=errors[:10])
    result["passed"] = first <= cached and every_gated and caches_match and not errors
    return result
