"""Child processes of the tests, benchmarks and drills (workers, web servers, load clients), always stopped.

Each child starts in a session of its own, so that Ctrl-C in the terminal reaches only the
benchmark, which then stops its children itself: SIGTERM to the child, and SIGKILL to its
process group (the child and whatever it forked, nothing else) if it has not gone in time.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path


class Child:
    """One started process; its output (stdout and stderr together) is kept, the last lines of it."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path, keep_lines: int = 400
    ) -> None:
        self.name = name
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.started = time.time()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """Everything kept so far; all of it once the process has exited and been waited for."""
        if not self.running:
            self._pump.join(timeout=5)
        return "\n".join(self.lines)

    def tail(self, count: int = 30) -> str:
        return "\n".join(list(self.lines)[-count:])

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._pump.join(timeout=5)
        return code

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM (a Celery worker's warm shutdown, gunicorn's graceful stop), then SIGKILL the group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the child's own group: leftovers it forked, if any
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self._pump.join(timeout=5)


class Children:
    """Every child started through it is stopped on ``stop_all()`` (call it in a ``finally``), or
    on leaving ``with Children() as children:``."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, argv: Sequence[str], *, env: dict[str, str], cwd: Path, keep_lines: int = 400) -> Child:
        child = Child(name, argv, env=env, cwd=cwd, keep_lines=keep_lines)
        self._children.append(child)
        return child

    def stop(self, child: Child, timeout: float = 30) -> None:
        child.stop(timeout)
        if child in self._children:
            self._children.remove(child)

    def stop_all(self) -> None:
        while self._children:
            self._children.pop().stop(timeout=10)


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.1, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
