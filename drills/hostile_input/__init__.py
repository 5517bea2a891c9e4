"""Drill 6: hostile input, against the whole API as its OpenAPI schema describes it.

1. **Schemathesis** (``schemathesis_run``) generates requests for every operation of
   ``/api/schema/`` as the service account: no server error, every status code and body
   documented. Short: 50 examples an operation; full: 200.
2. **Authorization sweep** (``sweeps``): every operation with four identities (anonymous, an
   unknown token, a plain account, the service account); the plain account's refused calls
   must write nothing.
3. **Bad bodies and path parameters** (``sweeps.bad_request_sweeps``):
   never 5xx, never a hang (10 s), nothing written (row counts compared around each request).

Any 5xx is matched with its traceback in the deployment's ``web.log``. The details go to
``hostile_input.json`` and schemathesis's own report to ``hostile_input-schemathesis.log``,
both in the deployment's log folder (``var/drills/<name>/``).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

from drills.deployment import PROJECT_DIR, Deployment
from drills.hostile_input import schemathesis_run, sweeps
from drills.hostile_input.common import operations, server_tracebacks, traceback_for


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    examples = 200 if full else 50
    seed = int(os.environ.get("HOSTILE_INPUT_SEED") or random.randrange(2**31))

    ops = operations(dep)
    fx = sweeps.Fixture(dep)
    started = time.monotonic()
    # In this order: the authorization sweep's service account makes changes the others must not meet.
    groups = sweeps.bad_request_sweeps(dep, ops, fx)
    groups["authz"] = sweeps.authorization_sweep(dep, ops, fx)
    print(f"   sweeps: {sum(map(len, groups.values()))} requests in {time.monotonic() - started:.1f}s", flush=True)

    started = time.monotonic()
    st_log = dep.logs / "hostile_input-schemathesis.log"
    report, requests, failures = schemathesis_run.run_schemathesis(dep, examples=examples, seed=seed, log=st_log)
    st_seconds = round(time.monotonic() - started, 1)
    print(f"   schemathesis: {requests} requests in {st_seconds}s", flush=True)

    time.sleep(0.5)  # let the web workers flush their last log lines
    tracebacks = server_tracebacks(dep.log_since_start("web"))
    found = schemathesis_run.summarise(report, failures, tracebacks, st_log)
    swept = sweeps.summarise(groups, tracebacks)
    run = report.get("operations") or {}
    result = {
        "seed": seed,
        "examples_per_operation": examples,
        "operations_total": run.get("total", 0),
        "operations_tested": run.get("tested", 0),
        "schemathesis_requests": requests,
        "schemathesis_seconds": st_seconds,
        **found,
        **swept,
        "throttled": found["throttled"] + swept["throttled"],
    }
    failed = [result[key] for key in ("server_errors", "undocumented_statuses", "schema_violations", "other_failures")]
    failed += [result[f"{group}_violations"] for group in groups]
    result["passed"] = result["operations_tested"] > 0 and requests > 0 and not any(failed)

    probes = [
        {
            "case": p.case,
            "request": f"{p.method} {p.path}",
            "status": p.answer.status,
            "seconds": round(p.answer.seconds, 3),
            "error": p.answer.error,
            "answer": p.answer.snippet(300),
            "problem": p.problem,
            "traceback": traceback_for(tracebacks, p.path) if p.answer.status >= 500 else "",
        }
        for probes in groups.values()
        for p in probes
    ]
    document = {"seed": seed, "examples_per_operation": examples, "schemathesis_report": report}
    document.update(schemathesis_log=str(st_log), schemathesis_failures=failures, probes=probes)
    details = dep.logs / "hostile_input.json"
    details.write_text(json.dumps(document, indent=2) + "\n")
    result["details"] = str(details.relative_to(PROJECT_DIR))
    return result
