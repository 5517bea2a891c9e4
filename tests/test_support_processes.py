"""The support layer's launcher (support/processes.py) on small Python children: what the drills'
deployment relies on (a log a child appends to, signals to its whole group, restarts like
systemd's Restart=always), checked here rather than first in a five-minute drill."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from support.processes import Child, Supervisor, wait_until

pytestmark = pytest.mark.processes

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
# A child that forks one of its own and prints that one's pid, as gunicorn and Celery fork workers.
FORKER = (
    "import subprocess, sys, time\n"
    "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(worker.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T stopped, Z exited), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_child_appends_to_its_log_and_reads_back_only_what_it_wrote(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("an earlier start\n")
    child = Child("once", [sys.executable, "-c", "print('hello')"], env=dict(os.environ), cwd=tmp_path, log=log)
    assert child.wait(timeout=30) == 0
    assert child.output() == "hello\n" and child.tail() == "hello"
    assert log.read_text() == "an earlier start\nhello\n"


def test_the_supervisor_restarts_what_exits_on_its_own_and_not_what_it_killed_or_stopped(tmp_path: Path) -> None:
    processes = Supervisor(env=dict(os.environ), cwd=tmp_path, logs=tmp_path)
    try:
        processes.run("brief", [sys.executable, "-c", "print('up')"])
        processes.run("killed", [sys.executable, "-c", SLEEPER])
        processes.run("stopped", [sys.executable, "-c", SLEEPER])
        processes.watch()
        wait_until(lambda: processes.restarts["brief"] >= 2, timeout=30, what="two restarts")
        wait_until(lambda: processes.log_since_start("brief") == "up\n", timeout=30, what="the last start's line")
        assert (tmp_path / "brief.log").read_text().count("up\n") >= 2  # every start appended to one log
        killed, stopped = processes.children["killed"], processes.children["stopped"]
        processes.kill("killed")
        processes.stop_process("stopped", timeout=5)
        time.sleep(1.5)  # three rounds of the watcher
        assert not killed.running and not stopped.running
        assert "killed" not in processes.children and "stopped" not in processes.children
        assert processes.restarts["killed"] == processes.restarts["stopped"] == 0
    finally:
        processes.stop_all()
    assert not processes.children


def test_pause_resume_and_stop_reach_what_the_process_forked(tmp_path: Path) -> None:
    processes = Supervisor(env=dict(os.environ), cwd=tmp_path, logs=tmp_path)
    try:
        processes.run("forker", [sys.executable, "-c", FORKER])
        wait_until(lambda: processes.log_since_start("forker").strip() != "", timeout=30, what="the worker's pid")
        parent, worker = processes.children["forker"].proc.pid, int(processes.log_since_start("forker"))
        processes.pause("forker")
        wait_until(lambda: state(parent) == state(worker) == "T", timeout=10, what="both stopped")
        processes.resume("forker")
        wait_until(lambda: "T" not in (state(parent), state(worker)), timeout=10, what="both running")
        processes.stop_process("forker", timeout=5)
        wait_until(lambda: state(worker) in (None, "Z"), timeout=10, what="the forked worker to end")
    finally:
        processes.stop_all()
