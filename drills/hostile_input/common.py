"""Hostile input: what every part shares (the API's operations from the schema, one raw
exchange with a deadline, the limits, a 5xx matched with its traceback in the web log)."""

from __future__ import annotations

import itertools
import re
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from drills.deployment import PROJECT_DIR, Deployment
from support.client import LOOPBACK

TIMEOUT = 10.0  # seconds a single request may take before it counts as a hang


@dataclass
class Answer:
    status: int  # 0: no answer (see error)
    body: bytes
    seconds: float
    error: str = ""

    def problem(self) -> str:
        """What is wrong with it whoever asked: no answer (or one cut short by the deadline), a 5xx."""
        if self.status == 0 or self.error:
            return f"no answer ({self.error})"
        return f"server error {self.status}" if self.status >= 500 else ""

    def snippet(self, size: int) -> str:
        return self.body[:size].decode(errors="replace")


def exchange(
    url: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    content_length: int | None = None,
) -> Answer:
    """One request on a new connection; gives up after TIMEOUT seconds in all.

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
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
    except OSError as exc:
        return Answer(0, b"", time.monotonic() - started, f"connect: {exc!r}")

    def send() -> None:
        try:
            sock.sendall(request)
        except OSError as exc:
            errors.append(f"send: {exc!r}")

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    received, hung = b"", ""
    with sock:
        try:
            while True:
                left = TIMEOUT - (time.monotonic() - started)
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except TimeoutError:
            hung = f"no complete answer in {TIMEOUT:g}s"
            errors.append(hung)
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
    return Answer(int(match.group(1)), content, seconds, hung)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # the template, as in the schema
    has_body: bool


def operations(dep: Deployment) -> list[Operation]:
    status, schema = dep.client("").request("GET", "/api/schema/?format=json")  # as anyone sees it
    if status != 200:
        raise RuntimeError(f"GET /api/schema/ answered {status}: {schema}")
    found = []
    for path, item in schema["paths"].items():
        for method, spec in ((m, item[m]) for m in ("get", "post", "put", "patch", "delete") if m in item):
            # DELETE .../members/ takes the body POST does, which the schema cannot show:
            # drf-spectacular documents request bodies for POST, PUT and PATCH only.
            has_body = "requestBody" in spec or method == "post" or (method == "delete" and path.endswith("/members/"))
            found.append(Operation(method.upper(), path, has_body))
    return found


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


def traceback_for(tracebacks: dict[str, list[str]], url_or_path: str) -> str:
    raw = urlsplit(url_or_path.split(" ", 1)[-1]).path
    for path in (unquote(raw), raw):  # Django keeps a path that is not UTF-8 percent-encoded
        logged = path.encode("unicode_escape").decode("ascii")
        if logged in tracebacks:
            return tracebacks[logged][0]
    return ""


def traceback_summary(traceback: str) -> str:
    """The exception and the innermost frame of the project's own code."""
    if not traceback:
        return "no traceback found"
    lines = traceback.splitlines()
    own = [line.strip() for line in lines if line.strip().startswith("File ") and str(PROJECT_DIR) in line]
    own = [line.replace(str(PROJECT_DIR) + "/", "") for line in own if ".venv" not in line]
    return lines[-1].strip() + (f" at {own[-1]}" if own else "")
