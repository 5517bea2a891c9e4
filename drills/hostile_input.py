"""Drill 6: hostile input.

Three parts, against the whole API as its OpenAPI schema describes it:

1. **Schemathesis** (the ``st`` CLI in a subprocess) generates requests for every operation
   of ``/api/schema/`` as the service account, and checks that no answer is a server error
   and that every answer is documented: its status code, and its body against the schema.
   Short: 50 examples an operation (about 50 s with the deployment); full: 200.
2. **Authorization sweep**: every operation of the schema (plus the schema and docs pages)
   with four identities: anonymous and an unknown token (401 on everything but the public
   pages), a plain account (its own user id allowed, another user's id and the operators'
   endpoints refused, never 200), and the service account (never 5xx). The plain account's
   refused calls must write nothing.
3. **Bad bodies** to every operation that takes a body, as the service account: 3 MB (a
   valid body padded with whitespace), not JSON, a JSON array, JSON nested 10,000 deep, a
   100 MB Content-Length with a small body, and a JSON body sent as text/plain; and hostile
   path parameters (a NUL byte, invalid UTF-8, encoded slashes, control characters, 3,000
   characters) with a valid body. Never 5xx, never a hang (10 s), and nothing written: row
   counts are compared around each request.

Any 5xx is matched with its traceback in the deployment's ``web.log``. The full details
(requests, answers, tracebacks) go to ``hostile_input.json`` and schemathesis's own report
(with a curl line for each failure) to ``hostile_input-schemathesis.log``, both in the
deployment's log folder (``var/drills/<name>/``).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import random
import re
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from drills.deployment import PROJECT_DIR, PYTHON, Deployment
from support.client import LOOPBACK

SHORT_EXAMPLES = 50
FULL_EXAMPLES = 200
TIMEOUT = 10.0  # seconds a single request may take before it counts as a hang
METHODS = ("get", "post", "put", "patch", "delete")
# Pages outside the schema (drf-spectacular leaves itself out) that anyone may read.
PUBLIC_PAGES = [("GET", "/api/schema/"), ("GET", "/api/docs/")]
TOKEN_LOGIN = ("POST", "/api/auth/token/")
# What a plain account may use besides its own user id (everything else is refused).
PLAIN_ALLOWED = {
    ("GET", "/api/communities/"),
    ("GET", "/api/communities/{slug}/"),
    ("GET", "/api/communities/{slug}/trending/"),
}
DENIED = {400, 403, 404, 405}
# Tables a refused or malformed request must not change.
WATCHED = {
    "signals": "SELECT count(*) FROM signals_app_signal",
    "leave records": "SELECT count(*) FROM community_communityleave WHERE user_id <> %(own)s",
    "leave history": "SELECT count(*) FROM community_leavehistory WHERE user_id <> %(own)s",
    "communities": "SELECT count(*) FROM community_community",
    "cohorts": "SELECT count(*) FROM community_cohort",
    "community members": "SELECT count(*) FROM community_communitymember",
    "cohort members": "SELECT count(*) FROM community_cohortmember",
}
NEVER_LEFT = 7_700_000_001  # a user id with no leave record: rejoining it changes nothing
FRESH = 7_800_000_000  # user ids above this are used once each, so that any write shows

MAKE_ACCOUNTS = """
import json
from django.contrib.auth import get_user_model
from accounts.services import token_issue
accounts = {}
for name in ("hostile-plain", "hostile-other"):
    user, _ = get_user_model().objects.get_or_create(username=name)
    accounts[name] = [user.pk, token_issue(user=user)[1]]
print(json.dumps(accounts))
"""


@dataclass
class HostileInputResult:
    seed: int
    examples_per_operation: int
    operations_total: int
    operations_tested: int
    schemathesis_requests: int
    schemathesis_seconds: float
    # Failures found by schemathesis, one line each (details in the JSON file).
    server_errors: list[str] = field(default_factory=list)
    undocumented_statuses: dict[str, list[int]] = field(default_factory=dict)
    schema_violations: list[str] = field(default_factory=list)
    other_failures: list[str] = field(default_factory=list)
    throttled: int = 0
    authz_requests: int = 0
    authz_statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    authz_violations: list[str] = field(default_factory=list)
    bad_body_requests: int = 0
    bad_body_statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    bad_body_violations: list[str] = field(default_factory=list)
    bad_path_requests: int = 0
    bad_path_statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    bad_path_violations: list[str] = field(default_factory=list)
    # Statuses the sweeps got that the schema does not declare: for the record, not a
    # failure (the sweeps check who gets what; schemathesis checks the schema).
    undocumented_in_sweeps: dict[str, list[int]] = field(default_factory=dict)
    details: str = ""

    @property
    def passed(self) -> bool:
        return (
            self.operations_tested > 0
            and self.schemathesis_requests > 0
            and not self.server_errors
            and not self.undocumented_statuses
            and not self.schema_violations
            and not self.other_failures
            and not self.authz_violations
            and not self.bad_body_violations
            and not self.bad_path_violations
        )


# --- HTTP on a bare socket: full control of the headers, and a hard time limit -----------------


@dataclass
class Answer:
    status: int  # 0: no answer (see error)
    body: bytes
    seconds: float
    error: str = ""

    @property
    def hung(self) -> bool:
        return self.error.startswith("no complete answer")

    def snippet(self, size: int = 200) -> str:
        return self.body[:size].decode(errors="replace")


def exchange(
    url: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    content_length: int | None = None,
    timeout: float = TIMEOUT,
) -> Answer:
    """One request on a new connection; gives up after ``timeout`` seconds in all.

    The body is sent from a thread while the answer is read, so that an early answer
    (413 before the body is read) is seen even if the server then resets the connection.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    if host not in LOOPBACK:
        raise ValueError(f"drills only target loopback addresses, not {url}")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'') if content_length is None else content_length}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    started = time.monotonic()
    errors: list[str] = []
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return Answer(0, b"", time.monotonic() - started, f"connect: {exc!r}")

    def send() -> None:
        try:
            sock.sendall(request)
        except OSError as exc:
            errors.append(f"send: {exc!r}")

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    received = b""
    with sock:
        try:
            while True:
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except TimeoutError:
            errors.append(f"no complete answer in {timeout:g}s")
        except OSError as exc:
            errors.append(f"recv: {exc!r}")
    sender.join(1)
    seconds = time.monotonic() - started
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    if match is None:
        return Answer(0, received, seconds, "; ".join(errors) or "no status line")
    _, _, content = received.partition(b"\r\n\r\n")
    # An answer that came whole before a reset is still the answer; one cut short by the
    # time limit is a hang.
    hung = [e for e in errors if e.startswith("no complete answer")]
    return Answer(int(match.group(1)), content, seconds, hung[0] if hung else "")


# --- The schema's operations ---------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # the template, as in the schema
    has_body: bool
    documented: frozenset[str] = frozenset()  # the status codes the schema declares

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"


def operations(dep: Deployment) -> list[Operation]:
    answer = exchange(dep.url, "GET", "/api/schema/?format=json", headers={"Accept": "application/json"})
    if answer.status != 200:
        raise RuntimeError(f"GET /api/schema/ answered {answer.status}: {answer.snippet()}")
    schema = json.loads(answer.body)
    found = []
    for path, item in schema["paths"].items():
        for method in (m for m in METHODS if m in item):
            spec = item[method]
            # DELETE .../members/ takes the body POST does, which the schema cannot show:
            # drf-spectacular documents request bodies for POST, PUT and PATCH only.
            has_body = "requestBody" in spec or method == "post" or (method == "delete" and path.endswith("/members/"))
            found.append(Operation(method.upper(), path, has_body, frozenset(spec.get("responses", {}))))
    return found


def undocumented(ops: list[Operation], probes: list[Probe]) -> dict[str, list[int]]:
    """Operation -> statuses the sweeps got that the schema does not declare."""
    by_label = {op.label: op for op in ops}
    found: dict[str, set[int]] = defaultdict(set)
    for probe in probes:
        if probe.case == "encoded slashes":
            continue  # the decoded slashes make another path: the operation never sees it
        op, status = by_label.get(f"{probe.method} {probe.template}"), probe.answer.status
        if op and status and not {"default", str(status)} & op.documented:
            found[op.label].add(status)
    return {label: sorted(statuses) for label, statuses in sorted(found.items())}


@dataclass
class Fixture:
    """What the sweeps act on: two plain accounts, a community and a cohort."""

    plain_id: int
    plain_token: str
    other_id: int  # the plain account's victim: left, a member, with a signal
    community: str
    cohort: str
    fresh: Iterator[int]

    def fill(self, template: str, *, user_id: int) -> str:
        path = template.replace("{user_id}", str(user_id))
        path = path.replace("{slug}", self.cohort if template.startswith("/api/cohorts/") else self.community)
        return re.sub(r"\{[^}]+\}", "1", path)

    def valid_body(self, op: Operation, tag: str) -> dict[str, Any]:
        """A body the operation would accept, acting on ids no other request uses."""
        if op.method == "DELETE" and op.path.endswith("/members/"):
            return {"user_ids": [self.other_id]}  # a member: a removal would show
        if op.path.endswith("/members/") or op.path.endswith("/bulk-leave/"):
            return {"user_ids": [next(self.fresh)]}
        if op.path == "/api/signals/":
            key = f"hostile-{tag}-{secrets.token_hex(6)}"
            return {"signals": [{"user_id": next(self.fresh), "item_id": 1, "kind": "like", "idempotency_key": key}]}
        if op.path in ("/api/communities/", "/api/cohorts/"):
            slug = f"hostile-{tag}-{secrets.token_hex(4)}"
            return {"slug": slug, "name": slug}
        if (op.method, op.path) == TOKEN_LOGIN:
            return {"username": "hostile-nobody", "password": secrets.token_hex(8)}
        return {}


def make_fixture(dep: Deployment) -> Fixture:
    accounts = json.loads(dep.manage("shell", "-c", MAKE_ACCOUNTS).strip().splitlines()[-1])
    (plain_id, plain_token), (other_id, _) = accounts["hostile-plain"], accounts["hostile-other"]
    service = {"Authorization": f"Token {dep.token}", "Content-Type": "application/json"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    signal = {"user_id": other_id, "item_id": 1, "kind": "like", "occurred_at": now}
    community, cohort = f"hostile-community-{secrets.token_hex(3)}", f"hostile-cohort-{secrets.token_hex(3)}"
    for method, path, body in [
        ("POST", "/api/communities/", {"slug": community, "name": community}),
        ("POST", "/api/cohorts/", {"slug": cohort, "name": cohort}),
        ("POST", f"/api/communities/{community}/members/", {"user_ids": [other_id]}),
        ("POST", f"/api/cohorts/{cohort}/members/", {"user_ids": [other_id]}),
        ("POST", "/api/signals/", {"signals": [signal]}),
        ("POST", f"/api/community-layer/{other_id}/leave/", None),
    ]:
        data = None if body is None else json.dumps(body).encode()
        answer = exchange(dep.url, method, path, headers=service, body=data)
        if answer.status not in (200, 201, 202):
            raise RuntimeError(f"set-up {method} {path} answered {answer.status}: {answer.snippet()}")
    fresh = iter(range(FRESH + secrets.randbelow(10**9), 2**63))
    return Fixture(plain_id, plain_token, other_id, community, cohort, fresh)


def watched_counts(dep: Deployment, *, own: int) -> dict[str, int]:
    query = "SELECT " + ", ".join(f"({sql})" for sql in WATCHED.values())
    row = dep.sql(query, {"own": own})[0]
    return dict(zip(WATCHED, row, strict=True))


def changed(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(f"{name} {before[name]}->{after[name]}" for name in before if before[name] != after[name])


# --- Part 2: the authorization sweep -----------------------------------------------------


@dataclass
class Probe:
    case: str  # who sent it (the sweep) or which bad body
    method: str
    path: str
    answer: Answer
    problem: str = ""
    template: str = ""  # the operation's path as in the schema


def authorization_sweep(dep: Deployment, ops: list[Operation], fx: Fixture) -> list[Probe]:
    identities = {
        "anonymous": {},
        "unknown token": {"Authorization": f"Token {secrets.token_hex(20)}"},
        "plain user": {"Authorization": f"Token {fx.plain_token}"},
        "service account": {"Authorization": f"Token {dep.token}"},
    }
    public = [Operation(m, p, False) for m, p in PUBLIC_PAGES]
    probes: list[Probe] = []
    for identity, auth in identities.items():
        # Refused calls by these identities must write nothing (the plain user's own id aside).
        before = watched_counts(dep, own=fx.plain_id)
        for op in [*public, *ops]:
            targets = [fx.other_id]
            if identity == "plain user" and "{user_id}" in op.path:
                targets = [fx.plain_id, fx.other_id]
            for user_id in targets:
                headers = dict(auth)
                body = None
                if op.has_body:
                    headers["Content-Type"] = "application/json"
                    body = json.dumps(fx.valid_body(op, identity.replace(" ", "-"))).encode()
                path = fx.fill(op.path, user_id=user_id)
                answer = exchange(dep.url, op.method, path, headers=headers, body=body)
                problem = judge(identity, op, user_id == fx.plain_id, answer)
                probes.append(Probe(identity, op.method, path, answer, problem, op.path))
        if identity != "service account":
            after = watched_counts(dep, own=fx.plain_id)
            if after != before:
                wrote = f"refused calls wrote rows: {changed(before, after)}"
                probes.append(Probe(identity, "-", "-", Answer(0, b"", 0.0), wrote))
    return probes


def judge(identity: str, op: Operation, own: bool, answer: Answer) -> str:
    """Why this answer is wrong for this identity, or "" if it is right."""
    key, status = (op.method, op.path), answer.status
    if status == 0 or answer.hung:
        return f"no answer ({answer.error})"
    if status >= 500:
        return f"server error {status}"
    if identity == "service account":
        return ""
    if key in PUBLIC_PAGES:
        if identity == "anonymous" and status != 200:
            return f"public page answered {status}, expected 200"
        return "" if status in (200, 401) else f"public page answered {status}"
    if key == TOKEN_LOGIN:
        return "" if status in (400, 401, 429) else f"log-in with a wrong password answered {status}"
    if identity in ("anonymous", "unknown token"):
        return "" if status == 401 else f"expected 401, got {status}"
    # The plain user.
    if own:
        return "" if 200 <= status < 300 else f"own user id refused with {status}"
    if key in PLAIN_ALLOWED:
        return "" if status == 200 else f"expected 200, got {status}"
    if 200 <= status < 300:
        what = "another user's id" if "{user_id}" in op.path else "an operators' endpoint"
        return f"{status} on {what}: must be refused"
    return "" if status in DENIED else f"expected 403 (or 400/404), got {status}"


# --- Part 3: malformed and oversized bodies ----------------------------------------------


def bad_bodies(fx: Fixture, op: Operation) -> dict[str, tuple[str, bytes, int | None]]:
    """name -> (content type, body, Content-Length to claim or None for the real one)."""
    valid = json.dumps(fx.valid_body(op, "bad")).encode()
    padded = valid[:-1] + b" " * (3 * 1024 * 1024) + valid[-1:]  # valid JSON, 3 MB
    return {
        "3 MB": ("application/json", padded, None),
        "not JSON": ("application/json", b"\xff\xfe{not: json,,", None),
        "JSON array": ("application/json", b"[1, 2, 3]", None),
        "nested 10,000 deep": ("application/json", b"[" * 10_000 + b"]" * 10_000, None),
        "100 MB Content-Length": ("application/json", json.dumps(fx.valid_body(op, "lie")).encode(), 100 * 2**20),
        "JSON as text/plain": ("text/plain", json.dumps(fx.valid_body(op, "plain")).encode(), None),
    }


def bad_body_sweep(dep: Deployment, ops: list[Operation], fx: Fixture) -> list[Probe]:
    probes = []
    for op in ops:
        if not op.has_body:
            continue
        # Leave and rejoin take no body: aim them at users for whom they change nothing
        # (the victim has left; NEVER_LEFT is active), so that any write shows.
        user_id = NEVER_LEFT if op.path.endswith("/rejoin/") else fx.other_id
        path = fx.fill(op.path, user_id=user_id)
        for name, (content_type, body, claimed) in bad_bodies(fx, op).items():
            before = watched_counts(dep, own=-1)
            headers = {"Authorization": f"Token {dep.token}", "Content-Type": content_type}
            answer = exchange(dep.url, op.method, path, headers=headers, body=body, content_length=claimed)
            after = watched_counts(dep, own=-1)
            probes.append(Probe(name, op.method, path, answer, problems(answer, before, after), op.path))
    return probes


# Path parameters ({user_id}, {slug}) as they appear in the URL, percent-encoded.
BAD_PATH_VALUES = {
    "NUL byte": "a%00b",
    "invalid UTF-8": "%FF%FE",
    "encoded slashes": "..%2F..%2Fx",
    "control characters": "%01%1B%7F",
    "3,000 characters": "x" * 3000,
}


def bad_path_sweep(dep: Deployment, ops: list[Operation], fx: Fixture) -> list[Probe]:
    """Every operation with a path parameter, with hostile values for it and a valid body."""
    probes = []
    for op in ops:
        if "{" not in op.path:
            continue
        for name, value in BAD_PATH_VALUES.items():
            path = re.sub(r"\{[^}]+\}", value, op.path)
            headers = {"Authorization": f"Token {dep.token}"}
            body = None
            if op.has_body:
                headers["Content-Type"] = "application/json"
                body = json.dumps(fx.valid_body(op, "path")).encode()
            before = watched_counts(dep, own=-1)
            answer = exchange(dep.url, op.method, path, headers=headers, body=body)
            after = watched_counts(dep, own=-1)
            probes.append(Probe(name, op.method, path, answer, problems(answer, before, after), op.path))
    return probes


def problems(answer: Answer, before: dict[str, int], after: dict[str, int]) -> str:
    """What is wrong with the answer to a malformed request: a 5xx, no answer, a write."""
    found = []
    if answer.status == 0 or answer.hung:
        found.append(f"no answer ({answer.error})")
    elif answer.status >= 500:
        found.append(f"server error {answer.status}")
    if after != before:
        found.append(f"wrote rows ({changed(before, after)}) with answer {answer.status}")
    return "; ".join(found)


# --- Part 1: schemathesis ----------------------------------------------------------------


def run_schemathesis(dep: Deployment, *, examples: int, seed: int, folder: Path, log: Path) -> dict[str, Any]:
    """Runs ``st run`` in ``folder`` (its reports and crash cache go there); returns its JSON report.

    Its events, one JSON document a line, are left in ``folder / "events.ndjson"``.
    """
    argv = [
        PYTHON,
        "-m",
        "schemathesis.cli",
        "run",
        f"{dep.url}/api/schema/",
        "--header",
        f"Authorization: Token {dep.token}",
        "--checks",
        "not_a_server_error,status_code_conformance,response_schema_conformance",
        "--continue-on-failure",  # else an operation stops at its first failure, hiding the rest
        "--max-examples",
        str(examples),
        "--seed",
        str(seed),
        "--workers",
        "2",
        "--request-timeout",
        str(TIMEOUT),
        "--generation-database",
        "none",
        "--report",
        "json,ndjson",
        "--report-json-path",
        str(folder / "report.json"),
        "--report-ndjson-path",
        str(folder / "events.ndjson"),
        "--no-color",
    ]
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
                    group = groups.get(key)
                    if group is None:
                        groups[key] = {
                            "operation": failure["operation"],
                            "code": failure["code"],
                            "title": failure["title"],
                            "status": status,
                            "message": message,
                            "count": 1,
                            "phase": scenario.get("phase"),
                            "request": f"{request.get('method')} {request.get('uri')}",
                            "request_body": decode(request.get("body")),
                            "response_body": decode(response.get("content")),
                        }
                    else:
                        group["count"] += 1
    return requests, sorted(groups.values(), key=lambda g: (g["code"], g["operation"], g["status"]))


# --- Tracebacks from the web log ---------------------------------------------------------

LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)
SERVER_ERROR = re.compile(r"ERROR django\.request Internal Server Error: (.+)$")


def server_tracebacks(text: str) -> dict[str, list[str]]:
    """Logged request path -> the tracebacks the web log ``text`` holds for it (carets dropped).

    Django logs the decoded path escaped with ``unicode_escape``; ``traceback_for`` matches it.
    """
    found: dict[str, list[str]] = defaultdict(list)
    starts = [m.start() for m in LOG_RECORD.finditer(text)] + [len(text)]
    for start, end in itertools.pairwise(starts):
        record = text[start:end]
        match = SERVER_ERROR.search(record.split("\n", 1)[0])
        if match:
            lines = [line for line in record.rstrip().splitlines() if line.strip().strip("^~") != ""]
            found[match.group(1)].append("\n".join(lines))
    return found


def traceback_summary(traceback: str) -> str:
    """The exception and the innermost frame of the project's own code."""
    lines = traceback.splitlines()
    own = [line.strip() for line in lines if line.strip().startswith("File ") and ".venv" not in line]
    own = [line for line in own if str(PROJECT_DIR) in line]
    where = own[-1].replace(str(PROJECT_DIR) + "/", "") if own else ""
    return f"{lines[-1].strip()}" + (f" at {where}" if where else "")


def traceback_for(tracebacks: dict[str, list[str]], url_or_path: str) -> str:
    raw = urlsplit(url_or_path.split(" ", 1)[-1]).path
    for path in (unquote(raw), raw):  # Django keeps a path that is not UTF-8 percent-encoded
        logged = path.encode("unicode_escape").decode("ascii")
        if logged in tracebacks:
            return tracebacks[logged][0]
    return ""


# --- The drill ---------------------------------------------------------------------------


def statuses(probes: list[Probe]) -> dict[str, dict[int, int]]:
    """Answers counted by status, for each identity (or kind of bad body)."""
    counts: dict[str, Counter[int]] = defaultdict(Counter)
    for probe in probes:
        if probe.method != "-":
            counts[probe.case][probe.answer.status] += 1
    return {name: dict(sorted(c.items())) for name, c in counts.items()}


def drill(dep: Deployment, *, full: bool) -> HostileInputResult:
    """Short: SHORT_EXAMPLES examples an operation. Full: FULL_EXAMPLES."""
    if urlsplit(dep.url).hostname not in LOOPBACK:
        raise ValueError(f"drills only target loopback addresses, not {dep.url}")
    examples = FULL_EXAMPLES if full else SHORT_EXAMPLES
    seed = int(os.environ.get("HOSTILE_INPUT_SEED") or random.randrange(2**31))

    ops = operations(dep)
    fx = make_fixture(dep)
    started = time.monotonic()
    bad = bad_body_sweep(dep, ops, fx)
    paths = bad_path_sweep(dep, ops, fx)
    authz = authorization_sweep(dep, ops, fx)
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
    summarise_sweeps(result, ops, authz, bad, paths, tracebacks)

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


def summarise_sweeps(
    result: HostileInputResult,
    ops: list[Operation],
    authz: list[Probe],
    bad: list[Probe],
    paths: list[Probe],
    tracebacks: dict[str, list[str]],
) -> None:
    result.authz_requests = sum(1 for p in authz if p.method != "-")
    result.authz_statuses = statuses(authz)
    result.bad_body_requests = len(bad)
    result.bad_body_statuses = statuses(bad)
    result.bad_path_requests = len(paths)
    result.bad_path_statuses = statuses(paths)
    result.undocumented_in_sweeps = undocumented(ops, [*authz, *bad, *paths])
    swept = ((authz, result.authz_violations), (bad, result.bad_body_violations), (paths, result.bad_path_violations))
    for probes, out in swept:
        for probe in probes:
            result.throttled += probe.answer.status == 429
            if not probe.problem:
                continue
            line = f"{probe.case}: {probe.method} {probe.path} -> {probe.problem}"
            if probe.answer.status >= 500:
                traceback = traceback_for(tracebacks, probe.path)
                line += f": {traceback_summary(traceback)}" if traceback else ": no traceback found"
            elif probe.method != "-" and probe.answer.status:
                line += f": {probe.answer.snippet(120)!r}"
            out.append(line)
