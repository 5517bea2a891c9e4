"""A small JSON client for the tests and the drills (standard library only): loopback addresses only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Client:
    def __init__(self, base_url: str, token: str) -> None:
        if urlsplit(base_url).hostname not in LOOPBACK:
            raise ValueError(f"only loopback addresses are targeted, not {base_url}")
        self.base_url = base_url.rstrip("/")
        self.token = token

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30) -> tuple[int, Any]:
        """Send one request; returns the status and the decoded body (None if not JSON).

        A connection failure is status 0, so that a drill can count it instead of dying.
        """
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Token {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:  # loopback only, checked above
                return response.status, _decode(response.read())
        except urllib.error.HTTPError as error:
            return error.code, _decode(error.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, None


def http(method: str, url: str, *, token: str, body: Any = None) -> tuple[int, Any]:
    """One request to an absolute loopback URL; returns the status and the decoded body."""
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return Client(f"{parts.scheme}://{parts.netloc}", token).request(method, path, body)


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")
