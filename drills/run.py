"""Run the drills, each on a deployment of its own on this machine (loopback only); exits 1 if any fails.

python -m drills.run            # the short version of every drill (what CI runs)
python -m drills.run --full     # the full version; writes RELIABILITY.md
python -m drills.run --only stop_forward worker_crash
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

from drills.deployment import PROJECT_DIR, Deployment

# The summary table's cells (load held, faults, lost), formatted from each drill's figures, in the drills' order.
RATE = "{signals_per_second:,.0f}/s"
LOST = (
    "{checks[missing]} missing, {checks[pending]} pending, {checks[duplicated]} doubled, "
    "aggregates equal: {checks[aggregates_match]} ({checks[accepted]:,} accepted)"
)
RACE = "{leaves:,} leaves; {violations} violations"
GATED = "{violations} of {must_be_gated:,} must-be-gated signals forwarded"
SUBSCRIBER = "{0}: up to v{{subscribers[{0}][applied_up_to]:,}}, {{subscribers[{0}][out_of_order]}} out of order, "
SUBSCRIBER += "{{subscribers[{0}][duplicates]:,}} duplicates"
SUMMARY = {
    "stop_forward": (RATE, RACE, GATED),
    "worker_crash": (RATE, "{kills} kill -9 ({killed_mid_batch} mid-batch)", LOST),
    "broker_loss": (RATE, "{flushes} flushes, {restarts} Redis restarts", LOST),
    "database_outage": ("", "PostgreSQL down {down_seconds:g} s", LOST),
    "leave_storm": ("{requests_per_second:,.0f}/s", "{changes:,} changes", ""),
    "hostile_input": ("", "{schemathesis_requests:,} generated requests", ""),
    "restore": ("", "restored to version {dump_version} under {processes} procs", ""),
    "backlog": ("", "{backlog_seconds:g} s backlog, {sweeps} sweeps", LOST),
    "auth_attacks": (
        "",
        "{attempts:,} attempts, {lockouts} lockouts",
        "{attacker_log_ins} attacker log-ins; {refused:,} refused",
    ),
    "webhooks": (
        "{requests_per_second:,.0f}/s",
        "{changes:,} changes; receivers: 500 to half, down {receiver_down_seconds:g} s; {worker_kills} worker kill -9",
        SUBSCRIBER.format("flaky_500_half") + "; " + SUBSCRIBER.format("down_30s"),
    ),
    "erasure": (
        RATE,
        "{erased_one_by_one} + {erased_in_bulk} users erased under load; kill -9 mid-job: {worker_killed_mid_job}",
        "{erased_signals_remaining} signals of erased users remain; aggregates equal: {aggregates_match}",
    ),
    "stop_forward_pooled": (RATE, f"through PgBouncer in transaction mode; {RACE}", GATED),
}
DRILLS = list(SUMMARY)


def run_one(name: str, *, full: bool) -> dict[str, Any]:
    """One drill on a deployment of its own: its figures, ``passed``, and what the verifier said."""
    module = importlib.import_module(f"drills.{name.removesuffix('_pooled')}")  # the same race behind PgBouncer
    started = time.monotonic()
    try:
        # Redis databases (broker, cache) 2-3, 4-5, ... 12-13, then from 2 again: each drill flushes its own first.
        broker_db = 2 + 2 * (DRILLS.index(name) % 6)
        with Deployment(name=f"tidal_drill_{name}", broker_db=broker_db, pooled=name.endswith("_pooled")) as dep:
            result = module.drill(dep, full=full)
            if dep.restarts:
                result["processes_restarted"] = dict(dep.restarts)
            # Whatever the drill did, the stored data must prove the promise.
            verified, result["verify_stop_forward"] = dep.verify_stop_forward()
            result["passed"] = result["passed"] and verified
    except Exception as exc:  # noqa: BLE001 - a drill that crashes is a failed drill, reported
        result = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    return result


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_figure(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list):
        return f"{len(value)} ({', '.join(map(str, value[:5]))})" if value else "none"
    return str(value)


def write_report(results: dict[str, dict[str, Any]], command: str) -> None:
    lines = f"""# Reliability

The promises of the design (stop-forward, fail closed, not retroactive, nothing lost), tried
against a real deployment on this machine: PostgreSQL, Redis, gunicorn with 2 workers, 2 Celery
worker processes and Celery beat, started from `deploy/systemd`'s units, driven over HTTP on
loopback, with faults injected. Produced by:

```
{command}
```

Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, {platform.machine()}. \
What each drill does is in the README's "Reliability drills".

| drill | result | load held | faults | lost |
|---|---|---|---|---|""".splitlines()
    for name, result in results.items():
        try:
            cells = [cell.format(**result) for cell in SUMMARY[name]]
        except KeyError:  # a drill that crashed has no figures
            cells = ["", "", result.get("error", "")]
        lines.append(f"| {name} | {'PASS' if result['passed'] else 'FAIL'} | {' | '.join(cells)} |")
    for name, result in results.items():
        lines += ["", f"## {name}", ""]
        lines += [f"- {key}: {_figure(value)}" for key, value in result.items() if key != "passed"]
    (PROJECT_DIR / "RELIABILITY.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    # A SIGTERM (CI's timeout, say) unwinds like Ctrl-C, so every deployment is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the full drills; writes RELIABILITY.md")
    parser.add_argument("--only", nargs="+", choices=DRILLS, default=DRILLS)
    options = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for name in options.only:
        print(f"== {name} ({'full' if options.full else 'short'})", flush=True)
        results[name] = run_one(name, full=options.full)
        print(json.dumps(results[name], indent=2, default=str), flush=True)
    if options.full:
        only = f" --only {' '.join(options.only)}" if options.only != DRILLS else ""
        write_report(results, f"python -m drills.run --full{only}")
    failed = [name for name, result in results.items() if not result["passed"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
