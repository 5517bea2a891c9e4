"""One raw HTTP exchange with a deadline, for the hostile-input sweeps and the attacks on the doors."""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from support.client import LOOPBACK

TIMEOUT = 10.0  # seconds a single request may take before it counts as a hang


@dataclass
class Answer:
    status: int  # 0: no answer (see error)
    body: bytes
    error: str = ""
    head: bytes = b""  # the status line and the headers

    def problem(self) -> str:
        """What is wrong with it whoever asked: no answer (or one cut short by the deadline), a 5xx."""
        if self.status == 0 or self.error:
            return f"no answer ({self.error})"
        return f"server error {self.status}" if self.status >= 500 else ""


def exchange(
    url: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str],
    body: bytes | None = None,
    timeout: float = TIMEOUT,
) -> Answer:
    """One request on a new connection (a Content-Length or Content-Type in ``headers`` is sent instead of
    the real length or JSON's type); gives up after ``timeout`` seconds in all.

    The body is sent from a thread while the answer is read, so that an early answer
    (413 before the body is read) is seen even if the server then resets the connection.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    if host not in LOOPBACK:
        raise ValueError(f"drills only target loopback addresses, not {url}")
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if "Content-Length" not in headers and (body is not None or method in ("POST", "PUT", "PATCH")):
        lines.append(f"Content-Length: {len(body or b'')}")
    if "Content-Type" not in headers and body is not None:
        lines.append("Content-Type: application/json")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    deadline = time.monotonic() + timeout
    errors: list[str] = []
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return Answer(0, b"", f"connect: {exc!r}")

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
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
            else:
                raise TimeoutError
        except TimeoutError:
            hung = f"no complete answer in {timeout:g}s"
            errors.append(hung)
        except OSError as exc:
            errors.append(f"recv: {exc!r}")
    sender.join(1)
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    if match is None:
        return Answer(0, received, "; ".join(errors) or "no status line")
    head, _, content = received.partition(b"\r\n\r\n")
    # An answer that came whole before a reset is still the answer; one cut short by the
    # deadline is a hang.
    return Answer(int(match.group(1)), content, hung, head)
