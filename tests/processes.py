"""Real processes for tests: a Celery worker and a loopback JSON client, nothing mocked.

Built on the support layer shared with the benchmarks and the drills (support/)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable

from support.client import http
from support.processes import Child, wait_until
from tests.helpers import PROJECT_DIR, PYTHON, child_env

__all__ = ["Worker", "http", "wait_for"]


class Worker:
    """A Celery worker process (prefork) on the test database and the configured broker."""

    def __init__(self, concurrency: int = 2) -> None:
        argv = [
            *(PYTHON, "-m", "celery", "-A", "tidalproject", "worker", "--pool=prefork"),
            f"--concurrency={concurrency}",
            *("--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"),
            *("--hostname", f"test-{uuid.uuid4().hex[:8]}@%h"),
        ]
        self.child = Child("worker", argv, env=child_env(), cwd=PROJECT_DIR, keep_lines=10_000)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: self._ready() or not self.child.running, timeout=60, what="the worker")
        if not self._ready():
            self.stop()
            raise RuntimeError("worker did not start:\n" + self.child.tail(40))

    def _ready(self) -> bool:
        return any(" ready." in line for line in self.child.lines)

    @property
    def lines(self) -> list[str]:
        return list(self.child.lines)

    def stop(self) -> None:
        self.child.stop(timeout=30)


def wait_for(condition: Callable[[], bool], *, timeout: float = 60, what: str = "condition") -> None:
    try:
        wait_until(condition, timeout=timeout, what=what)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
