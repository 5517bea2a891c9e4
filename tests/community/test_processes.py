"""The promises across real OS processes: each probe is a separate Python process with its
own leave cache and its own database connection, as a web or worker process would be."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from community.cache import leave_gate
from community.membership import MembershipStatus
from community.models import CommunityLeave
from community.services.layer import leave_community_layer, rejoin_community_layer
from tests.helpers import PROJECT_DIR, PYTHON, child_env, manage
from tests.processes import Worker, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.processes]


def rebuild_leave_status() -> subprocess.CompletedProcess[str]:
    return manage("rebuild_leave_status")


class Probe:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "tests.gate_probe"],
            cwd=PROJECT_DIR,
            env=env or child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"probe exited with {self.proc.poll()}"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def probes() -> Iterator[Any]:
    started: list[Probe] = []

    def start(env: dict[str, str] | None = None) -> Probe:
        started.append(Probe(env))
        return started[-1]

    yield start
    for probe in started:
        probe.close()


def test_a_leave_in_one_process_reaches_the_gate_of_another_at_its_next_fence(probes) -> None:
    a, b = probes(), probes()
    assert a.ask("gate 1 2")["left"] == [] and b.ask("gate 1 2")["left"] == []

    leave_community_layer(user_id=1)  # this test process
    assert a.ask("gate 1 2")["left"] == [1]
    assert b.ask("gate 1 2")["left"] == [1]

    assert a.ask("leave 2") == {"status": MembershipStatus.LEFT}  # process A
    assert b.ask("gate 1 2")["left"] == [1, 2]
    assert leave_gate().is_left(2)

    assert b.ask("rejoin 1") == {"status": MembershipStatus.ACTIVE}  # process B
    answer = a.ask("gate 1 2")
    assert answer["left"] == [2] and answer["warms"] == 1  # followed the feed, no re-warm
    assert not leave_gate().is_left(1)


def test_a_process_started_on_a_database_with_records_sees_them(probes) -> None:
    leave_community_layer(user_id=10)
    leave_community_layer(user_id=11)
    rejoin_community_layer(user_id=11)
    CommunityLeave.objects.create(user_id=12, value=b"\x09")
    answer = probes().ask("gate 10 11 12 13")
    assert answer["left"] == [10, 12] and answer["warms"] == 1


def test_rebuild_names_corrupt_rows_exits_non_zero_and_other_processes_rewarm(probes) -> None:
    leave_community_layer(user_id=1)
    running = probes()
    assert running.ask("gate 1 66")["left"] == [1]
    CommunityLeave.objects.create(user_id=66, value=b"\x05" * 9)  # outside the services: no feed row
    assert running.ask("gate 1 66")["left"] == [1]

    done = rebuild_leave_status()
    assert done.returncode != 0
    assert "corrupt record: user_id=66" in done.stderr
    assert "records: 2  active: 0  left: 1  corrupt: 1" in done.stdout

    answer = running.ask("gate 1 66")
    assert answer["left"] == [1, 66] and answer["warms"] == 2 and answer["generation"] == 1


def test_rebuild_exits_zero_on_clean_records() -> None:
    leave_community_layer(user_id=1)
    done = rebuild_leave_status()
    assert done.returncode == 0, done.stderr
    assert "records: 1  active: 0  left: 1  corrupt: 0" in done.stdout


@pytest.fixture
def empty_database_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment pointing at a brand-new, empty database of the same kind."""
    env = child_env()
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'empty.sqlite3'}"
        yield env
        return
    name = f"tidal_empty_{uuid.uuid4().hex[:12]}"
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    env["DATABASE_URL"] = env["DATABASE_URL"].rsplit("/", 1)[0] + f"/{name}"
    try:
        yield env
    finally:
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_works_on_an_empty_database_and_the_gate_then_answers(empty_database_env, probes) -> None:
    env = empty_database_env
    check = subprocess.run(
        [PYTHON, "manage.py", "check"], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr  # no query at start-up: tables do not exist yet
    migrate = subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput"],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    probe = probes(env)
    assert probe.ask("gate 1") == {"left": [], "version": 0, "generation": 0, "warms": 1}
    assert probe.ask("leave 1") == {"status": MembershipStatus.LEFT}
    assert probe.ask("gate 1")["left"] == [1]


def test_a_celery_worker_child_warms_its_cache_when_it_starts() -> None:
    leave_community_layer(user_id=1)
    worker = Worker(concurrency=1)
    try:
        wait_for(lambda: any("leave cache warmed" in line for line in worker.lines), timeout=30, what="the warm")
    finally:
        worker.stop()
    assert any("leave cache warmed (first use): 1 gated users" in line for line in worker.lines), "".join(
        worker.lines[-30:]
    )
