"""Users erased while their signals stream in, a worker killed with -9 in the middle of
the bulk erasure job (what must hold is in the README's table; run.py runs ``verify_stop_forward``)."""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from typing import Any

from drills import checks
from drills.deployment import Deployment
from support.processes import wait_until


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    # A job whose worker died is restarted by the sweep after 5 s here (default 300 s): the
    # workers read the setting, so they start again with it.
    dep.env["ERASURE_JOB_RESTART_AFTER_SECONDS"] = "5"
    for name in dep.workers():
        dep.stop_process(name)
        dep.start_worker(name)
    eraser = dep.service_client("drill-eraser", "community.erase_communityleave", "community.view_communityleave")
    client, users = dep.client(), list(range(30_000, 30_400))
    targets = checks.setup_targets(dep, client, users)
    chosen = random.Random(11).sample(users, 130)
    one_by_one, in_bulk = chosen[:30], chosen[30:]
    settle = 20.0 if full else 3.0  # seconds of load before the first erasure and after the last
    erased_at: dict[int, float] = {}  # user -> monotonic time its erasure answered (or its job finished)
    errors: Counter[str] = Counter()
    killed_mid_job = False

    def erase(users: list[int]) -> None:
        for user in users:
            status, _ = eraser.request("POST", f"/api/community-layer/{user}/erase/")
            if status == 200:
                erased_at[user] = time.monotonic()
            else:
                errors[str(status)] += 1
            time.sleep(0.1)

    def job_progress() -> dict[str, Any]:
        return eraser.request("GET", f"/api/erasures/{job['id']}/")[1] or {}

    with checks.SignalLoad(client, users, threads=2, batch=200) as load:
        time.sleep(settle)
        erase(one_by_one[:15])
        status, job = eraser.request("POST", "/api/erasures/", {"user_ids": in_bulk})
        assert status == 202, (status, job)
        # Kill the worker running the job once some users are done and some are not.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            progress = job_progress()
            if progress.get("state") == "done":
                break
            if 0 < progress.get("done", 0) < progress.get("total", 0):
                running = [name for name in dep.workers() if dep.mid_task(name, "run_erasure_job[")]
                if running:
                    killed_mid_job = progress["pending"] > 0
                    dep.crash(running[0])
                    break
            time.sleep(0.02)
        erase(one_by_one[15:])
        time.sleep(settle)  # erased users' signals keep coming: suppressed, never stored
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: job_progress().get("state") == "done", timeout=120, interval=0.5, what="the erasure job")
    progress = job_progress()
    job_done_at = time.monotonic()
    for user in in_bulk:
        erased_at.setdefault(user, job_done_at)
    drain = checks.wait_until_processed(dep)

    erased = set(erased_at)
    remaining = dep.sql("SELECT count(*) FROM signals_app_signal WHERE user_id = ANY(%s)", [sorted(erased)])[0][0]
    kept = [s for s in load.sent if s.user_id not in erased]
    actual = checks.actual_aggregates(dep)
    aggregates_match = actual == checks.expected_aggregates(kept, targets)
    errors.update(load.errors)
    return {
        "users": len(users),
        "erased_one_by_one": len(one_by_one),
        "erased_in_bulk": len(in_bulk),
        "signals_accepted": len(load.sent),
        "signals_posted_after_erasure": sum(
            1 for s in load.sent if s.posted_at > erased_at.get(s.user_id, float("inf"))
        ),
        "worker_killed_mid_job": killed_mid_job,
        "job_state": progress.get("state", "?"),
        "job_failed": progress.get("failed", -1),
        "signals_per_second": load.rate,
        "drain_seconds": drain,
        "erased_signals_remaining": remaining,
        "aggregates_match": aggregates_match,
        "aggregate_rows": len(actual),
        "http_errors": dict(errors),
        "passed": bool(
            killed_mid_job
            and progress.get("state") == "done"
            and progress.get("failed") == 0
            and not remaining
            and aggregates_match
            and not checks.server_errors(errors)
        ),
    }
