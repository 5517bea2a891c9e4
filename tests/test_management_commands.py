"""Each management command without a test of its own elsewhere, run through call_command.

Covered elsewhere: create_service_account and rotate_token (tests/accounts), erase_users,
retry_failed_signals and verify_stop_forward (tests/signals_app/test_commands.py),
rebuild_leave_status across processes (tests/community/test_processes.py). A last test
checks that every command of the project's apps is named in some test.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command, get_commands
from django.core.management.base import CommandError

from community.models import Cohort, CohortMember, Community, CommunityLeave, CommunityMember
from signals_app.models import Signal
from tests.helpers import PROJECT_DIR

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_import_memberships_adds_members_and_creates_groups_when_asked(tmp_path: Path) -> None:
    csv = tmp_path / "members.csv"
    csv.write_text("kind,slug,user_id\ncommunity,river,1\ncommunity,river,2\ncohort,early,1\n")
    with pytest.raises(CommandError, match="--create-groups"):
        _run("import_memberships", str(csv))
    assert "added 3, already there 0, groups created 2" in _run("import_memberships", str(csv), "--create-groups")
    assert Community.objects.filter(slug="river").exists() and Cohort.objects.filter(slug="early").exists()
    assert CommunityMember.objects.count() == 2 and CohortMember.objects.count() == 1
    assert "added 0, already there 3" in _run("import_memberships", str(csv))


def test_rebuild_leave_status_counts_and_fails_on_a_corrupt_record() -> None:
    assert "records: 0  active: 0  left: 0  corrupt: 0" in _run("rebuild_leave_status", "--no-progress")
    CommunityLeave.objects.create(user_id=5, value=b"\x07")
    with pytest.raises(CommandError, match="1 corrupt"):
        _run("rebuild_leave_status", "--no-progress")


def test_requeue_pending_signals_with_nothing_pending() -> None:
    assert _run("requeue_pending_signals", "--older-than", "0").startswith("enqueued 0 pending signal(s)")


def test_seed_demo_fills_an_empty_database_once() -> None:
    said = _run("seed_demo", "--users", "20", "--signals", "50")
    assert "signals sent" in said and "API token:" in said
    assert Signal.objects.count() == 50
    assert "nothing to do" in _run("seed_demo", "--users", "20", "--signals", "50")


def test_every_command_of_the_apps_is_named_in_a_test() -> None:
    ours = {name for name, app in get_commands().items() if app in {"accounts", "community", "signals_app"}}
    tests = "\n".join(path.read_text() for path in (PROJECT_DIR / "tests").rglob("test_*.py"))
    untested = sorted(name for name in ours if not re.search(rf"\b{name}\b", tests))
    assert not untested, f"commands without a test: {untested}"
