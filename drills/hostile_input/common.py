"""Hostile input: what every part shares (the API's operations from the schema, one raw
exchange with a deadline, the limits)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from drills.deployment import Deployment
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
