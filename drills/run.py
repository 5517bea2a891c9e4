"""Run the drills against a real deployment on this machine (loopback only).

    python -m drills.run            # the short version of every drill (what CI runs)
    python -m drills.run --full     # the full version; writes RELIABILITY.md
    python -m drills.run --only stop_forward worker_crash

Each drill starts its own deployment (PostgreSQL database, Redis databases, gunicorn with 2
workers, 2 Celery workers, Celery beat) and stops it. Exits 1 if any drill fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import platform
import signal
import sys
import time
from datetime import UTC, datetime
from typing import Any

from drills.deployment import PROJECT_DIR, Deployment

DRILLS = ["stop_forward", "worker_crash", "broker_loss", "database_outage", "leave_storm", "hostile_input", "restore"]
DRILLS += ["backlog", "auth_attacks", "webhooks", "erasure", "stop_forward_pooled"]


def as_dict(result: Any) -> dict[str, Any]:
    data = dataclasses.asdict(result) if dataclasses.is_dataclass(result) else dict(result)
    data["passed"] = bool(result.passed)
    return data


def run_one(name: str, *, full: bool) -> dict[str, Any]:
    module = importlib.import_module(f"drills.{name}")
    started = time.monotonic()
    restarts: dict[str, int] = {}
    try:
        # Each drill has Redis databases of its own (broker and cache): 2-3, 4-5, ... 12-13, then
        # again from 2 (drills run one after another, and each flushes its databases first).
        options = getattr(module, "DEPLOYMENT", {})  # e.g. {"pooled": True}
        broker_db = 2 + 2 * (DRILLS.index(name) % 6)
        with Deployment(name=f"tidal_drill_{name}", broker_db=broker_db, **options) as dep:
            result = as_dict(module.drill(dep, full=full))
            restarts = dep.restarts
            # Whatever the drill did, the stored data must prove the promise.
            verified, said = dep.verify_stop_forward()
            result["verify_stop_forward"] = said
            result["passed"] = result["passed"] and verified
    except Exception as exc:  # noqa: BLE001 - a drill that crashes is a failed drill, reported
        result = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    if restarts:
        result["processes_restarted"] = dict(restarts)
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


def _summary(name: str, r: dict[str, Any]) -> tuple[str, str, str]:
    """(load held, faults, lost) for the summary table."""
    g = r.get
    checks = g("checks", {})
    lost = (
        f"{checks['missing'] + checks['pending']} missing or pending, {checks['duplicated']} doubled, "
        f"aggregates {'equal' if checks['aggregates_match'] else 'DIFFER'} ({checks['accepted']:,} accepted)"
        if checks
        else ""
    )
    rate = g("signals_per_second") or g("requests_per_second")
    load = f"{rate:,.0f}/s" if rate else ""
    faults = {
        "stop_forward": f"{g('leaves', 0):,} leaves; {g('violations', '?')} violations",
        "worker_crash": f"{g('kills', 0)} kill -9 ({g('killed_mid_batch', 0)} mid-batch)",
        "broker_loss": f"{g('flushes', 0)} flushes, {g('restarts', 0)} Redis restarts",
        "database_outage": f"PostgreSQL down {g('down_seconds', 0):g} s",
        "leave_storm": f"{g('changes', 0):,} changes",
        "hostile_input": f"{g('schemathesis_requests', 0):,} generated requests",
        "restore": f"restored to version {g('dump_version', '?')} under {g('processes', 0)} procs",
        "backlog": f"{g('backlog_seconds', 0):g} s backlog, {g('sweeps', 0)} sweeps",
        "auth_attacks": f"{g('attempts', 0):,} attempts, {g('lockouts', 0)} lockouts",
        "webhooks": f"{g('changes', 0):,} changes; receivers: 500 to half, down {g('receiver_down_seconds', 0):g} s; "
        f"{g('worker_kills', 0)} worker kill -9",
        "erasure": f"{g('erased_one_by_one', 0) + g('erased_in_bulk', 0)} users erased under load; "
        f"kill -9 mid-job: {g('worker_killed_mid_job')}",
    }.get(name, "")
    if name == "auth_attacks":
        lost = f"{g('attacker_log_ins', '?')} attacker log-ins; {g('refused', 0):,} refused"
    if name == "webhooks":
        lost = "; ".join(
            f"{n}: up to v{s['applied_up_to']:,}, {s['out_of_order']} out of order, {s['duplicates']:,} duplicates"
            for n, s in g("subscribers", {}).items()
        )
    if name == "stop_forward_pooled":
        _, faults, lost = _summary("stop_forward", r)
        faults = f"through PgBouncer in transaction mode; {faults}"
    if name == "stop_forward":
        lost = f"{g('violations', '?')} of {g('must_be_gated', 0):,} must-be-gated signals forwarded"
    if name == "erasure":
        lost = (
            f"{g('erased_signals_remaining', '?')} signals of erased users remain; aggregates "
            f"{'equal' if g('aggregates_match') else 'DIFFER'}; verifier exit 0: {g('verify_exit_0')}"
        )
    return load, faults, lost


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
        load, faults, lost = _summary(name, result)
        lines.append(f"| {name} | {'PASS' if result['passed'] else 'FAIL'} | {load} | {faults} | {lost} |")
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
        write_report(
            results,
            "python -m drills.run --full" + (f" --only {' '.join(options.only)}" if options.only != DRILLS else ""),
        )
    failed = [name for name, result in results.items() if not result["passed"]]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
