"""A restore under the running deployment moves the leave clock backwards: every process must gate the new
leaver at once, though the clock then reads below the version it cached; the leaves that overtake the cached
version are the case only the history row at that version can tell."""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from drills import checks
from drills.checks import GATED
from drills.deployment import Deployment

# Why a process re-warmed its cache, without the versions (they differ from process to process).
WARMED = re.compile(r"leave cache warmed \((clock went back|history at version|[^)]+)")


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    client, users = dep.client(), list(range(60_000, 60_000 + (60 if full else 30)))
    checks.setup_targets(dep, client, users)
    errors: list[str] = []

    def leave(user_id: int) -> int:
        status, body = client.request("POST", f"/api/community-layer/{user_id}/leave/")
        if status != 200:
            errors.append(f"leave {user_id}: {status}")
            return -1
        return int(body["version"])

    def post(user_id: int, count: int) -> list[str]:
        """Post ``count`` keyed signals for ``user_id``, one request each (spread over the web processes)."""
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

    before, after, rest = users[:5], users[5:15], users[15:]
    for user_id in before:
        leave(user_id)
    dump_version = dep.clock()
    dump = dep.logs / "restore-drill.dump"
    subprocess.run(["pg_dump", "--format=custom", f"--file={dump}", dep.database_url], check=True, timeout=120)
    for user_id in after:
        leave(user_id)
    # Every process syncs to the clock after the dump (each answers with its cache's version).
    processes = sum(map(len, checks.caches(dep, client, samples=16)[0].values()))
    cached = dep.clock()

    restore = ["pg_restore", "--clean", "--if-exists", "--single-transaction", f"--dbname={dep.database_url}"]
    subprocess.run([*restore, str(dump)], check=True, timeout=300, capture_output=True)
    # Workers paused with signals queued for the next leaver: when they resume, they gate
    # with the cache they had, fenced by the restored clock.
    leaver = rest[0]
    with dep.workers_paused():
        queued = post(leaver, 12)
        first = leave(leaver)
        received = post(leaver, 24)
    # Overtake: more leaves than the versions lost, so the clock passes what processes cached.
    overtakers = rest[1 : 1 + len(after) + 2]
    for user_id in overtakers:
        leave(user_id)
    overtaken = [key for user_id in overtakers for key in post(user_id, 2)]
    checks.wait_until_processed(dep, timeout=120)
    time.sleep(0.5)
    found = Counter(WARMED.findall("".join(dep.log_since_start(name) for name in ["web", *dep.workers()])))
    reasons = {"history rewritten" if r == "history at version" else r: n for r, n in found.items() if r != "first use"}
    result: dict[str, Any] = {
        "dump_version": dump_version,
        "cached_version_before_restore": cached,
        "processes": processes,
        "version_after_first_leave": first,
    }
    every_gated = True
    query = "SELECT count(*) FROM signals_app_signal WHERE idempotency_key = ANY(%s) AND outcome = %s"
    for kind, keys in (("queued", queued), ("received", received), ("overtaken", overtaken)):
        result[f"{kind}_gated"], result[f"{kind}_total"] = dep.sql(query, [keys, GATED])[0][0], len(keys)
        every_gated = every_gated and result[f"{kind}_gated"] == len(keys) > 0
    caches, caches_match = checks.caches(dep, client, samples=16)
    result.update(warm_reasons=reasons, **caches, errors=errors[:10])
    result["passed"] = first <= cached and every_gated and caches_match and not errors
    return result
