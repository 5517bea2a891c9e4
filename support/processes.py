"""Child processes of the tests, benchmarks and drills (workers, web servers, load clients, a pooler), always stopped.

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
from subprocess import DEVNULL, PIPE, STDOUT

Env = dict[str, str]  # a child's environment variables


class Child:
    """One started process; its output (stdout and stderr together) is kept, the last lines of it,
    or appended to a ``log`` file, which outlives it (a drill reads what a killed worker wrote)."""

    def __init__(
        self, name: str, argv: Sequence[str], *, env: Env, cwd: Path, keep_lines: int = 400, log: Path | None = None
    ) -> None:
        self.name, self.argv, self.log = name, list(argv), log
        self.lines: collections.deque[str] = collections.deque(maxlen=keep_lines)
        self.started = time.time()
        self.log_offset = log.stat().st_size if log and log.exists() else 0  # where this start's output begins
        with contextlib.ExitStack() as files:  # the child has its own descriptor of the log
            output = files.enter_context(log.open("ab")) if log else PIPE
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=DEVNULL, stdout=output, stderr=STDOUT, text=True, start_new_session=True
            )
        self._pump = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():  # none when the output goes to a log
            self.lines.append(line.rstrip("\n"))

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        """Everything kept so far; all of it once the process has exited and been waited for.
        With a log, what this process wrote there (not what earlier ones of its name wrote)."""
        if self.log:
            with self.log.open("rb") as log:
                log.seek(self.log_offset)
                return log.read().decode(errors="replace")
        if not self.running:
            self._pump.join(timeout=5)
        return "\n".join(self.lines)

    def tail(self, count: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-count:])

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._pump.join(timeout=5)
        return code

    def signal_group(self, number: int) -> None:
        """Signal the child and all it forked (gunicorn's and Celery's workers), as systemd does a unit."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, number)

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        self.wait(timeout=10)

    def stop(self, timeout: float = 30, *, group: bool = False) -> None:
        """SIGTERM (a Celery worker's warm shutdown, gunicorn's graceful stop) to the child, or with
        ``group`` to all of the group as systemd does, then SIGKILL to the group (whatever is left)."""
        if self.running:
            self.signal_group(signal.SIGTERM) if group else self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill()


class Children:
    """Every child started through it is stopped on ``stop_all()`` (call it in a ``finally``), or
    on leaving ``with Children() as children:``."""

    def __init__(self) -> None:
        self._children: list[Child] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, argv: Sequence[str], *, env: Env, cwd: Path, keep_lines: int = 400) -> Child:
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


class Supervisor:
    """Processes by name, run as systemd runs units with Restart=always: after ``watch()``, one that
    exits on its own is started again and counted in ``restarts`` (a drill's fault can take one down
    with it, as a Redis restart can a Celery worker); one killed or stopped through it stays down
    until run again. They share an environment, read at each start, and each appends to logs/<name>.log."""

    def __init__(self, *, env: Env, cwd: Path, logs: Path) -> None:
        self.env, self.cwd, self.logs = env, cwd, logs
        self.children: dict[str, Child] = {}
        self.restarts: collections.Counter[str] = collections.Counter()
        self._lock = threading.RLock()  # so that a process let go is never started again
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="supervisor", daemon=True)

    def run(self, name: str, argv: Sequence[str]) -> None:
        with self._lock:
            self.children[name] = Child(name, argv, env=self.env, cwd=self.cwd, log=self.logs / f"{name}.log")

    def watch(self) -> None:
        """From now on (before, a process that cannot start is an error to report, not to retry)."""
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopping.wait(0.5):
            with self._lock:
                for name, child in self.children.items():
                    if not child.running:
                        self.run(name, child.argv)
                        self.restarts[name] += 1

    def _let_go(self, name: str) -> Child:
        with self._lock:
            return self.children.pop(name)

    def kill(self, name: str) -> None:
        """kill -9 the process ``name`` (its whole group): no chance to finish or hand back work."""
        self._let_go(name).kill()

    def pause(self, name: str) -> None:
        """SIGSTOP the process ``name`` (its whole group): it keeps its state, takes no work."""
        self.children[name].signal_group(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.children[name].signal_group(signal.SIGCONT)

    def stop_process(self, name: str, *, timeout: float = 20) -> None:
        if name in self.children:
            self._let_go(name).stop(timeout, group=True)

    def log_since_start(self, name: str) -> str:
        return self.children[name].output()

    def stop_all(self) -> None:
        self._stopping.set()  # the watcher starts nothing more; one it started meanwhile is in children
        for name in list(self.children):
            self.stop_process(name)


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
