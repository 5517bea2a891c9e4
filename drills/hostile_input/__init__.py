"""Hostile input, against the whole API as its OpenAPI schema describes it: schemathesis
generates requests for every operation as the service account (no server error, every status
code and body documented); the sweeps (``sweeps``) try bad bodies and path parameters, then four
identities on every operation. Schemathesis's own output and report go to the deployment's log folder."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections import Counter
from typing import Any

from drills.deployment import PROJECT_DIR, PYTHON, Deployment
from drills.hostile_input import sweeps
from drills.hostile_input.common import TIMEOUT

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"
# schemathesis's failure codes: a 5xx, a status code the schema does not document, a body against the schema.
FAILURES = {"ST101": "server_errors", "ST103": "undocumented_statuses", "ST108": "schema_violations"}


def drill(dep: Deployment, *, full: bool) -> dict[str, Any]:
    examples = 200 if full else 50
    seed = int(os.environ.get("HOSTILE_INPUT_SEED") or random.randrange(2**31))
    fx = sweeps.Fixture(dep)
    # In this order: the authorization sweep's service account makes changes the others must not meet.
    swept = sweeps.bad_request_sweeps(dep, fx) | {"authz": sweeps.authorization_sweep(dep, fx)}

    started = time.monotonic()
    log, report_file = dep.logs / "hostile_input-schemathesis.log", dep.logs / "hostile_input-schemathesis.json"
    argv = [PYTHON, "-m", "schemathesis.cli", "run", f"{dep.url}/api/schema/", "--checks", CHECKS]
    argv += ["--header", f"Authorization: Token {dep.token}", "--no-color", "--generation-database", "none"]
    argv += ["--continue-on-failure"]  # else an operation stops at its first failure, hiding the rest
    argv += ["--max-examples", str(examples), "--seed", str(seed), "--workers", "2"]
    argv += ["--request-timeout", str(TIMEOUT), "--report", "json", "--report-json-path", str(report_file)]
    report_file.unlink(missing_ok=True)  # the folder outlives the deployment: never read an old run's report
    limit = 300 + examples * 12
    with log.open("w") as out:
        try:  # in the log folder, where anything else it writes goes too
            subprocess.run(argv, cwd=dep.logs, stdout=out, stderr=subprocess.STDOUT, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"schemathesis ran past {limit}s; see {log}") from None
    report = json.loads(report_file.read_text())
    run = report.get("operations") or {}
    result: dict[str, Any] = {
        "seed": seed,
        "examples_per_operation": examples,
        "operations_total": run.get("total", 0),
        "operations_tested": run.get("tested", 0),
        "schemathesis_requests": report["test_cases"]["generated"],
        "schemathesis_seconds": round(time.monotonic() - started, 1),
        **{key: [] for key in FAILURES.values()},
        "other_failures": [f"schemathesis error: {e['title']} x{e['count']}" for e in report["errors"]],
    }
    # What failed where; schemathesis's log has each failure's request and answer.
    for failure in report["failures"]:
        found = f"{failure['title']} x{failure['count']}: {', '.join(failure['operations'])}"
        result[FAILURES.get(failure["code"], "other_failures")].append(f"{failure['code']} {found}")
    if not report["complete"]:
        result["other_failures"].append(f"schemathesis did not finish: {report['stop_reason']}; see {log}")
    for group, sweep in swept.items():
        result |= sweep.figures(group)

    time.sleep(0.5)  # let the web workers flush their last log lines
    result["server_tracebacks"] = server_tracebacks(dep.log_since_start("web"))
    failed = [result[key] for key in [*FAILURES.values(), "other_failures"]]
    failed += [result[f"{group}_violations"] for group in swept]
    result["passed"] = result["operations_tested"] > 0 and result["schemathesis_requests"] > 0 and not any(failed)
    return result


def server_tracebacks(log: str) -> list[str]:
    """One line for each 5xx the web log (JSON records) holds: the path, the exception and the innermost
    frame of the project's own code, and how often."""
    found: Counter[str] = Counter()
    for line in log.splitlines():
        record = json.loads(line) if '"logger": "django.request"' in line else {}
        if record.get("level") == "ERROR":  # Django's record of a 5xx answer
            trace = record.get("exc_info", "").splitlines() or ["no traceback"]
            own = [frame.strip() for frame in trace if f'File "{PROJECT_DIR}/' in frame and ".venv" not in frame]
            where = " at " + own[-1].replace(f"{PROJECT_DIR}/", "") if own else ""
            found[f"{record['message']}: {trace[-1].strip()}{where}"] += 1
    return [f"{line} x{count}" for line, count in found.items()]
