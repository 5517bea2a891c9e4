"""Management commands: import_memberships, requeue_pending_signals, seed_demo."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError

from community.models import Cohort, CohortMember, Community, CommunityLeave, CommunityMember
from signals_app.models import Outcome, Signal
from tests.helpers import backdate, ingest, run_command, sig

pytestmark = pytest.mark.django_db


def memberships() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    return (
        sorted(CommunityMember.objects.values_list("community__slug", "user_id")),
        sorted(CohortMember.objects.values_list("cohort__slug", "user_id")),
    )


@pytest.fixture
def csv_file(tmp_path: Path):
    def write(text: str) -> str:
        path = tmp_path / "members.csv"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def groups(db) -> None:
    Community.objects.create(slug="python", name="Python")
    Community.objects.create(slug="rust", name="Rust")
    Cohort.objects.create(slug="early", name="Early")


# --- import_memberships ----------------------------------------------------------------------------


def test_import_reads_header_communities_and_cohorts_exactly(groups, csv_file) -> None:
    path = csv_file("kind,slug,user_id\ncommunity,python,1\ncommunity,python,2\ncommunity,rust,1\ncohort,early,3\n")
    out = run_command("import_memberships", path)
    assert memberships() == ([("python", 1), ("python", 2), ("rust", 1)], [("early", 3)])
    assert "added 4" in out and "groups created 0" in out


def test_import_keeps_existing_members_and_counts_them(groups, csv_file) -> None:
    run_command("import_memberships", csv_file("community,python,1\n"))
    out = run_command("import_memberships", csv_file("community,python,1\ncommunity,python,2\ncommunity,python,2\n"))
    assert "added 1, already there 1" in out
    assert memberships()[0] == [("python", 1), ("python", 2)]


def test_import_of_an_unknown_slug_fails_and_imports_nothing(groups, csv_file) -> None:
    # The good lines sort both before and after the bad group: all or nothing either way.
    path = csv_file("community,python,1\ncohort,early,2\ncommunity,zzz,3\ncommunity,aaa,4\n")
    with pytest.raises(CommandError, match="--create-groups"):
        run_command("import_memberships", path)
    assert memberships() == ([], [])
    assert not Community.objects.filter(slug__in=["aaa", "zzz"]).exists()


def test_a_file_that_is_not_utf8_is_named_and_imports_nothing(groups, tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"community,python,1\ncommunity,py\xe9thon,2\n")
    with pytest.raises(CommandError, match=r"not UTF-8 text \(byte 0xe9"):
        run_command("import_memberships", str(path))
    assert memberships() == ([], [])


def test_import_with_create_groups_creates_them(groups, csv_file) -> None:
    out = run_command(
        "import_memberships", csv_file("community,go,1\ncohort,late,2\ncommunity,python,3\n"), "--create-groups"
    )
    assert memberships() == ([("go", 1), ("python", 3)], [("late", 2)])
    assert Community.objects.filter(slug="go").exists() and Cohort.objects.filter(slug="late").exists()
    assert "groups created 2" in out


@pytest.mark.parametrize("bad_id", ["-1", "x", "1.5", str(2**63), ""])
def test_a_bad_user_id_names_its_line_and_imports_nothing(groups, csv_file, bad_id: str) -> None:
    path = csv_file(f"kind,slug,user_id\ncommunity,python,1\ncohort,early,2\ncommunity,rust,{bad_id}\n")
    with pytest.raises(CommandError, match=r"^line 4\b"):
        run_command("import_memberships", path)
    assert memberships() == ([], [])


@pytest.mark.parametrize(
    "line", ["community,python", "community,python,1,2", "group,python,1", "Community,python,1"], ids=str
)
def test_a_malformed_line_names_its_line(groups, csv_file, line: str) -> None:
    with pytest.raises(CommandError, match=r"^line 2\b"):
        run_command("import_memberships", csv_file(f"community,python,1\n{line}\n"))
    assert memberships() == ([], [])


@pytest.mark.parametrize("slug", ["Python", "py thon", "p" * 65, "-py"])
def test_a_bad_slug_with_create_groups_is_an_error(groups, csv_file, slug: str) -> None:
    with pytest.raises(CommandError, match="slug"):
        run_command("import_memberships", csv_file(f"community,python,1\ncommunity,{slug},2\n"), "--create-groups")
    assert memberships() == ([], [])
    assert Community.objects.count() == 2


def test_a_missing_file_is_a_command_error(db, tmp_path) -> None:
    with pytest.raises(CommandError):
        run_command("import_memberships", str(tmp_path / "nope.csv"))


# --- requeue_pending_signals ---------------------------------------------------------------------


def test_requeue_command_prints_how_many_it_enqueued(sender, enqueued) -> None:
    old = ingest(sender, sig(1), sig(2), sig(3))
    backdate(old, timedelta(minutes=30))
    ingest(sender, sig(4))
    assert run_command("requeue_pending_signals", "--older-than", "600").strip() == "enqueued 3 pending signal(s)"
    assert enqueued == [old]


def test_requeue_command_with_nothing_pending_enqueues_nothing(db, enqueued) -> None:
    assert "enqueued 0 " in run_command("requeue_pending_signals")
    assert enqueued == []


# --- seed_demo ------------------------------------------------------------------------------------


def test_seed_demo_fills_data_once(db, enqueued) -> None:
    out = run_command("seed_demo", "--users", "40", "--signals", "120")
    assert "demo data: 5 communities, 3 cohorts, 40 users (4 left), 120 signals sent" in out
    assert "service account 'demo-service', API token: " in out
    assert (Community.objects.count(), Cohort.objects.count()) == (5, 3)
    # Signals of the users who left are gated on receipt; the others wait for a worker.
    left = set(CommunityLeave.objects.values_list("user_id", flat=True))
    pending = Signal.objects.filter(outcome=Outcome.PENDING)
    assert pending.count() + Signal.objects.filter(outcome=Outcome.GATED).count() == 120
    assert not pending.filter(user_id__in=left).exists()
    assert CommunityLeave.objects.count() == 4
    state = (Signal.objects.count(), CommunityMember.objects.count(), CohortMember.objects.count())
    again = run_command("seed_demo", "--users", "40", "--signals", "120")
    assert "already there: nothing to do" in again
    assert (Signal.objects.count(), CommunityMember.objects.count(), CohortMember.objects.count()) == state
