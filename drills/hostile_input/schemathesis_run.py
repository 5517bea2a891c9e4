"""Hostile input, part 1: schemathesis generates requests for every operation of the schema."""

from __future__ import annotations

import base64
import json
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from drills.deployment import PYTHON, Deployment
from drills.hostile_input.common import TIMEOUT, HostileInputResult, traceback_for, traceback_summary


def run_schemathesis(dep: Deployment, *, examples: int, seed: int, folder: Path, log: Path) -> dict[str, Any]:
    """Runs ``st run`` in ``folder`` (its reports and crash cache go there); returns its JSON report.

    Its events, one JSON document a line, are left in ``folder / "events.ndjson"``.
    """
    argv = [PYTHON, "-m", "schemathesis.cli", "run", f"{dep.url}/api/schema/"]
    argv += ["--header", f"Authorization: Token {dep.token}", "--no-color", "--generation-database", "none"]
    argv += ["--checks", "not_a_server_error,status_code_conformance,response_schema_conformance"]
    argv += ["--continue-on-failure"]  # else an operation stops at its first failure, hiding the rest
    argv += ["--max-examples", str(examples), "--seed", str(seed), "--workers", "2", "--request-timeout", str(TIMEOUT)]
    argv += ["--report", "json,ndjson", "--report-json-path", str(folder / "report.json")]
    argv += ["--report-ndjson-path", str(folder / "events.ndjson")]
    limit = 300 + examples * 12
    with log.open("w") as out:
        try:
            subprocess.run(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"schemathesis ran past {limit}s; see {log}") from None
    report_file = folder / "report.json"
    if not report_file.exists():
        raise RuntimeError(f"schemathesis wrote no report; see {log}")
    report: dict[str, Any] = json.loads(report_file.read_text())
    return report


def decode(content: Any, size: int = 300) -> str:
    if not isinstance(content, dict):
        return ""
    raw = base64.b64decode(content["$base64"]) if "$base64" in content else str(content.get("string", "")).encode()
    text = raw[:size].decode(errors="replace")
    return text + (f"... ({len(raw)} bytes)" if len(raw) > size else "")


def schemathesis_failures(events: Path) -> tuple[int, list[dict[str, Any]]]:
    """Requests made, and the failures grouped by operation, check, status and message."""
    requests = 0
    groups: dict[tuple[str, str, int, str], dict[str, Any]] = {}
    with events.open() as lines:
        for line in lines:
            scenario = json.loads(line).get("ScenarioFinished")
            if not scenario or "interactions" not in scenario.get("recorder", {}):
                continue
            recorder = scenario["recorder"]
            requests += len(recorder["interactions"])
            for case_id, checks in recorder.get("checks", {}).items():
                interaction = recorder["interactions"].get(case_id) or {}
                request, response = interaction.get("request") or {}, interaction.get("response") or {}
                status = int(response.get("status_code") or 0)
                for check in checks:
                    if check.get("status") != "failure":
                        continue
                    failure = check["failure_info"]["failure"]
                    message = (failure.get("message") or "").strip()
                    first = message.splitlines()[0] if message else ""
                    key = (failure["operation"], failure["code"], status, first)
                    group = groups.setdefault(key, {"operation": failure["operation"], "code": failure["code"]})
                    if "count" in group:
                        group["count"] += 1
                        continue
                    group.update(title=failure["title"], status=status, message=message, count=1)
                    group.update(phase=scenario.get("phase"), request=f"{request.get('method')} {request.get('uri')}")
                    group.update(
                        request_body=decode(request.get("body")), response_body=decode(response.get("content"))
                    )
    return requests, sorted(groups.values(), key=lambda g: (g["code"], g["operation"], g["status"]))


def summarise_schemathesis(
    result: HostileInputResult,
    report: dict[str, Any],
    failures: list[dict[str, Any]],
    tracebacks: dict[str, list[str]],
    log: Path,
) -> None:
    gaps: dict[str, set[int]] = defaultdict(set)
    for failure in failures:
        op, status, count = failure["operation"], failure["status"], failure["count"]
        if failure["code"] == "ST101":
            failure["traceback"] = traceback_for(tracebacks, failure["request"])
            summary = traceback_summary(failure["traceback"]) if failure["traceback"] else "no traceback found"
            body = failure["request_body"][:160]
            example = failure["request"] + (f" body {body!r}" if body else "")
            result.server_errors.append(f"{op}: {status} x{count}, e.g. {example}: {summary}")
        elif failure["code"] == "ST103":
            gaps[op].add(status)
        elif failure["code"] == "ST108":
            result.schema_violations.append(f"{op}: {status} body {failure['message'].splitlines()[0]} x{count}")
        else:
            result.other_failures.append(f"{failure['code']} {failure['title']}: {op} {status} x{count}")
        result.throttled += count if status == 429 else 0
    result.undocumented_statuses = {op: sorted(s) for op, s in sorted(gaps.items())}
    result.other_failures += [f"schemathesis error: {e['title']} x{e['count']}" for e in report.get("errors", [])]
    if not report.get("complete", False):
        result.other_failures.append(f"schemathesis did not finish: {report.get('stop_reason')}; see {log}")
