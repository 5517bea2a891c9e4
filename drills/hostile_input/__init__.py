"""Drill 6: hostile input, against the whole API as its OpenAPI schema describes it.

1. **Schemathesis** (``schemathesis_run``) generates requests for every operation of
   ``/api/schema/`` as the service account: no server error, every status code and body
   documented. Short: 50 examples an operation; full: 200.
2. **Authorization sweep** (``sweeps``): every operation with four identities (anonymous, an
   unknown token, a plain account, the service account); the plain account's refused calls
   must write nothing.
3. **Bad bodies and path parameters** (``sweeps.bad_bodies``, ``sweeps.BAD_PATH_VALUES``):
   never 5xx, never a hang (10 s), nothing written (row counts compared around each request).

Any 5xx is matched with its traceback in the deployment's ``web.log``. The details go to
``hostile_input.json`` and schemathesis's own report to ``hostile_input-schemathesis.log``,
both in the deployment's log folder (``var/drills/<name>/``).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from drills.deployment import PROJECT_DIR, Deployment
from drills.hostile_input import sweeps
from drills.hostile_input.common import HostileInputResult, operations, server_tracebacks, traceback_for
from drills.hostile_input.schemathesis_run import run_schemathesis, schemathesis_failures, summarise_schemathesis
from support.client import LOOPBACK

SHORT_EXAMPLES, FULL_EXAMPLES = 50, 200


def drill(dep: Deployment, *, full: bool) -> HostileInputResult:
    """Short: SHORT_EXAMPLES examples an operation. Full: FULL_EXAMPLES."""
    if urlsplit(dep.url).hostname not in LOOPBACK:
        raise ValueError(f"drills only target loopback addresses, not {dep.url}")
    examples = FULL_EXAMPLES if full else SHORT_EXAMPLES
    seed = int(os.environ.get("HOSTILE_INPUT_SEED") or random.randrange(2**31))

    ops = operations(dep)
    fx = sweeps.make_fixture(dep)
    started = time.monotonic()
    bad = sweeps.bad_body_sweep(dep, ops, fx)
    paths = sweeps.bad_path_sweep(dep, ops, fx)
    authz = sweeps.authorization_sweep(dep, ops, fx)
    sent = len(bad) + len(paths) + len(authz)
    print(f"   sweeps: {sent} requests in {time.monotonic() - started:.1f}s", flush=True)

    started = time.monotonic()
    st_log = dep.logs / "hostile_input-schemathesis.log"
    with tempfile.TemporaryDirectory(prefix="hostile-input-") as folder:
        report = run_schemathesis(dep, examples=examples, seed=seed, folder=Path(folder), log=st_log)
        st_seconds = time.monotonic() - started
        requests, failures = schemathesis_failures(Path(folder) / "events.ndjson")
    print(f"   schemathesis: {requests} requests in {st_seconds:.1f}s", flush=True)

    time.sleep(0.5)  # let the web workers flush their last log lines
    tracebacks = server_tracebacks(dep.log_since_start("web"))
    operations_run = report.get("operations") or {}
    result = HostileInputResult(
        seed=seed,
        examples_per_operation=examples,
        operations_total=operations_run.get("total", 0),
        operations_tested=operations_run.get("tested", 0),
        schemathesis_requests=requests,
        schemathesis_seconds=round(st_seconds, 1),
    )
    summarise_schemathesis(result, report, failures, tracebacks, st_log)
    sweeps.summarise_sweeps(result, ops, authz, bad, paths, tracebacks)

    details = dep.logs / "hostile_input.json"
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
        for p in [*bad, *paths, *authz]
    ]
    document = {
        "seed": seed,
        "examples_per_operation": examples,
        "schemathesis_report": report,
        "schemathesis_log": str(st_log),
        "schemathesis_failures": failures,
        "probes": probes,
    }
    details.write_text(json.dumps(document, indent=2) + "\n")
    result.details = str(details.relative_to(PROJECT_DIR))
    return result
