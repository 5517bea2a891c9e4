"""Hostile input, part 1: schemathesis generates requests for every operation of the schema."""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from drills.deployment import PYTHON, Deployment
from drills.hostile_input.common import TIMEOUT, traceback_for, traceback_summary


def run_schemathesis(dep: Deployment, *, examples: int, seed: int, log: Path) -> tuple[dict[str, Any], int, list]:
    """Runs ``st run`` in a folder of its own (its reports and crash cache go there): its JSON report,
    the requests it made and the failures it found (from its events)."""
    with tempfile.TemporaryDirectory(prefix="hostile-input-") as name:
        folder = Path(name)
        argv = [PYTHON, "-m", "schemathesis.cli", "run", f"{dep.url}/api/schema/"]
        argv += ["--header", f"Authorization: Token {dep.token}", "--no-color", "--generation-database", "none"]
        argv += ["--checks", "not_a_server_error,status_code_conformance,response_schema_conformance"]
        argv += ["--continue-on-failure"]  # else an operation stops at its first failure, hiding the rest
        argv += ["--max-examples", str(examples), "--seed", str(seed), "--workers", "2"]
        argv += ["--request-timeout", str(TIMEOUT), "--report", "json,ndjson"]
        argv += ["--report-json-path", "report.json", "--report-ndjson-path", "events.ndjson"]  # in the folder
        limit = 300 + examples * 12
        with log.open("w") as out:
            try:
                subprocess.run(argv, cwd=folder, stdout=out, stderr=subprocess.STDOUT, timeout=limit, check=False)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"schemathesis ran past {limit}s; see {log}") from None
        if not (folder / "report.json").exists():
            raise RuntimeError(f"schemathesis wrote no report; see {log}")
        return json.loads((folder / "report.json").read_text()), *failures(folder / "events.ndjson")


def decode(content: Any, size: int = 300) -> str:
    if not isinstance(content, dict):
        return ""
    raw = base64.b64decode(content["$base64"]) if "$base64" in content else str(content.get("string", "")).encode()
    text = raw[:size].decode(errors="replace")
    return text + (f"... ({len(raw)} bytes)" if len(raw) > size else "")


def failures(events: Path) -> tuple[int, list[dict[str, Any]]]:
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


def summarise(
    report: dict[str, Any], failures: list[dict[str, Any]], tracebacks: dict[str, list[str]], log: Path
) -> dict[str, Any]:
    """The failures schemathesis found, one line each (the details go to the JSON file)."""
    found: dict[str, Any] = {"server_errors": [], "schema_violations": [], "other_failures": [], "throttled": 0}
    gaps: dict[str, set[int]] = defaultdict(set)
    for failure in failures:
        op, status, count = failure["operation"], failure["status"], failure["count"]
        if failure["code"] == "ST101":
            failure["traceback"] = traceback_for(tracebacks, failure["request"])
            body = failure["request_body"][:160]
            example = failure["request"] + (f" body {body!r}" if body else "")
            summary = traceback_summary(failure["traceback"])
            found["server_errors"].append(f"{op}: {status} x{count}, e.g. {example}: {summary}")
        elif failure["code"] == "ST103":
            gaps[op].add(status)
        elif failure["code"] == "ST108":
            found["schema_violations"].append(f"{op}: {status} body {failure['message'].splitlines()[0]} x{count}")
        else:
            found["other_failures"].append(f"{failure['code']} {failure['title']}: {op} {status} x{count}")
        found["throttled"] += count if status == 429 else 0
    found["undocumented_statuses"] = {op: sorted(s) for op, s in sorted(gaps.items())}
    found["other_failures"] += [f"schemathesis error: {e['title']} x{e['count']}" for e in report.get("errors", [])]
    if not report.get("complete", False):
        found["other_failures"].append(f"schemathesis did not finish: {report.get('stop_reason')}; see {log}")
    return found
