"""Management commands: the in-process test of rebuild_leave_status, and a check that every
command of the project's apps is run by some test.

The other commands are tested beside what they change: import_memberships,
requeue_pending_signals and seed_demo in tests/signals_app/test_commands.py, erase_users in
tests/signals_app/test_erasure.py, retry_failed_signals and verify_stop_forward in
tests/signals_app/test_evidence.py, create_service_account and rotate_token in
tests/accounts/test_tokens.py, rebuild_leave_status across processes in
tests/community/test_processes.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import get_commands
from django.core.management.base import CommandError

from community.models import CommunityLeave
from tests.helpers import PROJECT_DIR, run_command

pytestmark = pytest.mark.django_db


def test_rebuild_leave_status_counts_and_fails_on_a_corrupt_record() -> None:
    assert "records: 0  active: 0  left: 0  corrupt: 0" in run_command("rebuild_leave_status", "--no-progress")
    CommunityLeave.objects.create(user_id=5, value=b"\x07")
    with pytest.raises(CommandError, match="1 corrupt"):
        run_command("rebuild_leave_status", "--no-progress")


def test_every_command_of_the_apps_is_run_by_a_test() -> None:
    """Run, not only mentioned: the name must appear quoted, as a command's argument
    (``run_command("name", ...)``, ``call_command("name")``, ``manage("name")``)."""
    ours = {config.name for config in apps.get_app_configs() if Path(config.path).parent == PROJECT_DIR}
    commands = {name for name, app in get_commands().items() if app in ours}
    assert {"rebuild_leave_status", "erase_users", "rotate_token"} <= commands, commands
    tests = "\n".join(path.read_text() for path in (PROJECT_DIR / "tests").rglob("test_*.py"))
    untested = sorted(name for name in commands if not re.search(rf"[\"']{name}[\"']", tests))
    assert not untested, f"commands no test runs: {untested}"
