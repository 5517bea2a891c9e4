"""Hostile input: what every part shares (the API's operations from the schema, one raw
exchange with a deadline, the limits, a 5xx matched with its traceback in the web log)."""

from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from drills.deployment import PROJECT_DIR, Deployment
from support.client import LOOPBACK

TIMEOUT = 10.0  # seconds a single request may take before it counts as a hang
METHODS = ("get", "post", "put", "patch", "delete")
# Pages outside the schema (drf-spectacular leaves itself out) that anyone may read.
PUBLIC_PAGES = [("GET", "/api/schema/"), ("GET", "/api/docs/")]
TOKEN_LOGIN = ("POST", "/api/auth/token/")


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
        failures = (self.server_errors, self.undocumented_statuses, self.schema_violations, self.other_failures)
        violations = (self.authz_violations, self.bad_body_violations, self.bad_path_violations)
        return self.operations_tested > 0 and self.schemathesis_requests > 0 and not any(failures + violations)


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
