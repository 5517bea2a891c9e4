"""Real processes for tests: a Celery worker and a tiny HTTP client, nothing mocked."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from tests.conftest import PROJECT_DIR, PYTHON, child_env


class Worker:
    """A Celery worker process (prefork) on the test database and the configured broker."""

    def __init__(self, concurrency: int = 2) -> None:
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "tidalproject",
                "worker",
                "--pool=prefork",
                f"--concurrency={concurrency}",
                "--loglevel=INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
                "--hostname",
                f"test-{uuid.uuid4().hex[:8]}@%h",
            ],
            cwd=PROJECT_DIR,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._ready.wait(60):
            self.stop()
            raise RuntimeError("worker did not start:\n" + "".join(self.lines[-40:]))

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if " ready." in line:
                self._ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def wait_for(condition: Callable[[], bool], *, timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def http(method: str, url: str, *, token: str, body: Any = None) -> tuple[int, Any]:
    """One real HTTP request; returns the status and the decoded JSON body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Token {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
