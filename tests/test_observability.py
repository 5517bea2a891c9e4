"""Metrics, request ids and structured logs."""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest

from tests.helpers import PROJECT_DIR, PYTHON

pytestmark = pytest.mark.django_db


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_metrics_count_leaves_and_fence_syncs(api, client, member, django_capture_on_commit_callbacks) -> None:
    before = client.get("/metrics").content.decode()
    api.force_authenticate(member)
    with django_capture_on_commit_callbacks(execute=True):
        assert api.post(f"/api/community-layer/{member.pk}/leave/").status_code == 200
    from community.cache import leave_gate

    leave_gate()
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    after = response.content.decode()
    name = 'tidal_leave_changes_total{action="leave",source="api"}'
    assert metric(after, name) == metric(before, name) + 1
    assert metric(after, "tidal_leave_fence_syncs_total") > metric(before, "tidal_leave_fence_syncs_total")


@pytest.mark.django_db(transaction=True)  # the log line is written on commit, inside the request
def test_a_request_id_is_returned_and_put_on_the_log_lines(api, member, caplog) -> None:
    api.force_authenticate(member)
    with caplog.at_level("INFO"):
        response = api.post(f"/api/community-layer/{member.pk}/leave/", HTTP_X_REQUEST_ID="req-42")
    assert response["X-Request-ID"] == "req-42"
    (record,) = [r for r in caplog.records if r.getMessage() == "community layer leave"]
    assert record.user_id == member.pk  # type: ignore[attr-defined]
    assert record.request_id == "req-42"  # type: ignore[attr-defined]


def test_an_unsafe_request_id_is_replaced(api, member) -> None:
    api.force_authenticate(member)
    response = api.get(f"/api/community-layer/{member.pk}/", HTTP_X_REQUEST_ID="bad id\nwith newline")
    assert response["X-Request-ID"] != "bad id\nwith newline" and len(response["X-Request-ID"]) == 32


def test_production_logs_are_one_json_object_a_line(tmp_path) -> None:
    env = {
        "DJANGO_SETTINGS_MODULE": "tidalproject.settings.production",
        "SECRET_KEY": secrets.token_urlsafe(64),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "PATH": "/usr/bin:/bin",
    }
    code = "import logging; logging.getLogger('tidal.test').warning('hello', extra={'user_id': 7})"
    done = subprocess.run(
        [PYTHON, "manage.py", "shell", "-c", code], cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "hello" in line]
    entry = json.loads(line)
    assert entry["message"] == "hello" and entry["level"] == "WARNING" and entry["user_id"] == 7
    assert {"time", "logger", "request_id", "task_id"} <= set(entry)
