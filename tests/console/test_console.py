"""The operators' console in the admin: dashboard, a user's page, bulk leave (issue 3)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import DatabaseError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from community import forms
from community.membership import MembershipStatus
from community.models import CommunityLeave, LeaveClock, LeaveHistory
from community.selectors import leave_changes_per_day, leave_record_counts
from community.services.layer import leave_community_layer, rejoin_community_layer
from console import views as console_views
from signals_app.models import Outcome, Signal
from signals_app.selectors import outcomes_per_hour
from signals_app.services.processing import signals_process
from tests.factories import OPERATOR_PERMS, UserFactory
from tests.helpers import ingest, join, logged_in, sig, written

pytestmark = pytest.mark.django_db

DASHBOARD = reverse("admin:community_console")
FIND = reverse("admin:community_console_find")
BULK = reverse("admin:community_console_bulk_leave")
INDEX = reverse("admin:index")
LOGIN = reverse("admin:login")
CHANGELIST = reverse("admin:community_communityleave_changelist")
CORRUPT = b"\x07" * 9


def user_url(user_id: Any) -> str:
    return reverse("admin:community_console_user", kwargs={"user_id": user_id})


def leave_url(user_id: Any) -> str:
    return reverse("admin:community_console_user_leave", kwargs={"user_id": user_id})


def rejoin_url(user_id: Any) -> str:
    return reverse("admin:community_console_user_rejoin", kwargs={"user_id": user_id})


def shown_messages(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def console_operator() -> Any:
    return UserFactory(is_staff=True, perms=OPERATOR_PERMS)


@pytest.fixture
def client_(console_operator) -> Client:
    return logged_in(console_operator)


@pytest.fixture
def viewer() -> Any:
    """Staff who may look at the leave records but change nothing and see no signals."""
    return UserFactory(is_staff=True, perms=["community.view_communityleave"])


# --- who may use it ----------------------------------------------------------------------

ALL_URLS = [DASHBOARD, f"{FIND}?user_id=5", user_url(5), leave_url(5), rejoin_url(5), BULK]
WRITE_URLS = [leave_url(5), rejoin_url(5), BULK]


@pytest.mark.parametrize("url", ALL_URLS)
def test_anonymous_is_sent_to_the_login_page(url) -> None:
    r = Client().get(url)
    assert r.status_code == 302
    assert r["Location"].startswith(LOGIN)


@pytest.mark.parametrize("url", ALL_URLS)
def test_non_staff_with_every_permission_is_sent_to_the_login_page(url) -> None:
    client = logged_in(UserFactory(perms=OPERATOR_PERMS))
    for method in (client.get, client.post):
        r = method(url)
        assert r.status_code == 302
        assert r["Location"].startswith(LOGIN)
    assert written() == ([], 0, 0)


@pytest.mark.parametrize("url", ALL_URLS)
def test_staff_without_permissions_gets_403(url) -> None:
    client = logged_in(UserFactory(is_staff=True, perms=["signals_app.view_signal"]))
    assert client.get(url).status_code == 403
    assert client.post(url, {"user_ids": "5", "confirm": "1"}).status_code == 403
    assert written() == ([], 0, 0)


@pytest.mark.parametrize("url", WRITE_URLS)
def test_writes_need_the_change_permission(viewer, url) -> None:
    client = logged_in(viewer)
    assert client.get(url).status_code == 403
    assert client.post(url, {"user_ids": "5", "confirm": "1"}).status_code == 403
    assert written() == ([], 0, 0)


def test_a_viewer_sees_the_pages_without_buttons_or_signals(viewer) -> None:
    client = logged_in(viewer)
    r = client.get(DASHBOARD)
    assert r.status_code == 200
    assert "per_hour" not in r.context
    assert "needs the <code>signals_app.view_signal</code> permission" in r.content.decode()
    assert BULK not in r.content.decode()
    r = client.get(user_url(5))
    assert r.status_code == 200
    html = r.content.decode()
    assert 'id="leave-button"' not in html and 'id="rejoin-button"' not in html
    assert "signals" not in r.context


def test_the_admin_index_links_the_console_for_operators_only(client_) -> None:
    r = client_.get(INDEX)
    assert r.status_code == 200
    html = r.content.decode()
    assert f'href="{DASHBOARD}"' in html and f'href="{BULK}"' in html
    assert "Community layer" in html  # the stock app list is still there
    r = logged_in(UserFactory(is_staff=True, perms=["signals_app.view_signal"])).get(INDEX)
    assert r.status_code == 200
    assert DASHBOARD not in r.content.decode()
    r = logged_in(UserFactory(is_staff=True, is_superuser=True)).get(reverse("admin:app_list", args=["community"]))
    assert r.status_code == 200
    assert f'href="{DASHBOARD}"' in r.content.decode()


def test_the_changelist_links_the_console_and_each_user_page(client_) -> None:
    leave_community_layer(user_id=31)
    html = client_.get(CHANGELIST).content.decode()
    assert f'href="{DASHBOARD}"' in html and f'href="{BULK}"' in html
    assert f'href="{user_url(31)}"' in html


# --- dashboard numbers -------------------------------------------------------------------


def _days_ago(days: int) -> Any:
    return timezone.now() - timedelta(days=days)


@pytest.fixture
def changes() -> None:
    """Left now: 1, 2, 3 (3 corrupt); rejoined: 4. History: 4 leaves and 1 rejoin today,
    plus a leave 3 days ago and one 20 days ago (outside the window)."""
    for user_id in (1, 2, 4):
        leave_community_layer(user_id=user_id)
    rejoin_community_layer(user_id=4)
    CommunityLeave.objects.create(user_id=3, value=CORRUPT)  # no history: written outside the service
    leave_community_layer(user_id=5)
    rejoin_community_layer(user_id=5)
    LeaveHistory.objects.filter(user_id=5, action="leave").update(at=_days_ago(3))
    LeaveHistory.objects.filter(user_id=5, action="rejoin").update(at=_days_ago(20))


def test_dashboard_counts_equal_what_was_written(client_, changes) -> None:
    r = client_.get(DASHBOARD)
    assert r.status_code == 200
    counts = r.context["counts"]
    assert (counts.left_now, counts.left, counts.corrupt, counts.active) == (3, 2, 1, 2)
    html = r.content.decode()
    assert '<span class="value" id="users-left-now">3</span>' in html
    assert '<span class="value" id="users-corrupt">1</span>' in html
    per_day = r.context["per_day"]
    assert len(per_day) == 14
    today = timezone.localdate()
    assert per_day[-1].day == today and per_day[0].day == today - timedelta(days=13)
    by_day = {d.day: (d.leaves, d.rejoins) for d in per_day}
    assert by_day[today] == (3, 1)
    assert by_day[today - timedelta(days=3)] == (1, 0)
    assert sum(leaves + rejoins for leaves, rejoins in by_day.values()) == 5  # the 20-day-old rejoin is outside
    row = re.search(rf'<tr data-day="{today:%Y-%m-%d}">.*?</tr>', html)
    assert row and '<td class="num leaves">3</td><td class="num rejoins">1</td>' in row[0]
    assert "<svg" in html and 'id="changes-chart"' in html


def test_dashboard_counts_follow_a_leave(client_, changes) -> None:
    leave_community_layer(user_id=4)
    assert client_.get(DASHBOARD).context["counts"].left_now == 4


@pytest.fixture
def signals_by_hour() -> dict[str, int]:
    """Now: 2 attributed, 3 gated, 1 no target, 1 pending; 2 hours ago: 1 gated; 30 hours ago: 1 attributed."""
    sender = UserFactory(perms=["signals_app.add_signal"])
    from community.models import Community

    join(1, Community.objects.create(slug="python", name="Python"))
    leave_community_layer(user_id=2)
    now_ids = ingest(sender, sig(1), sig(1, item_id=2), sig(3))
    signals_process(signal_ids=now_ids)
    ingest(sender, sig(2), sig(2), sig(2))  # gated on receipt
    earlier = ingest(sender, sig(2))
    old = ingest(sender, sig(1))
    signals_process(signal_ids=old)
    Signal.objects.filter(id__in=earlier).update(processed_at=timezone.now() - timedelta(hours=2))
    Signal.objects.filter(id__in=old).update(processed_at=timezone.now() - timedelta(hours=30))
    ingest(sender, sig(1))  # still pending
    return {"attributed": 2, "gated": 3, "no_target": 1, "pending": 1, "failed": 0}


def test_dashboard_shows_signals_by_outcome_per_hour(client_, signals_by_hour) -> None:
    r = client_.get(DASHBOARD)
    per_hour = r.context["per_hour"]
    assert len(per_hour) == 24
    assert per_hour[-1].hour == timezone.now().replace(minute=0, second=0, microsecond=0)
    assert per_hour[-1].counts == signals_by_hour
    assert per_hour[-3].counts == {"attributed": 0, "gated": 1, "no_target": 0, "pending": 0, "failed": 0}
    total = sum(sum(h.counts.values()) for h in per_hour)
    assert total == sum(signals_by_hour.values()) + 1  # the 30-hour-old one is outside
    html = r.content.decode()
    assert 'id="outcomes-chart"' in html
    assert html.count("<rect ") >= 4 + 1  # four outcomes now, one two hours ago
    assert "2 attributed" in html and "3 gated" in html


def test_outcomes_per_hour_agrees_with_the_outcome_summary(signals_by_hour) -> None:
    from signals_app.selectors import outcome_summary

    now = timezone.now()
    last_hour = outcome_summary(now=now)["last_hour"]
    current = outcomes_per_hour(now=now)[-1].counts
    assert current == {key: last_hour[key] for key in current}


def test_selectors_on_an_empty_database() -> None:
    assert leave_record_counts().left_now == 0
    assert all(d.leaves == d.rejoins == 0 for d in leave_changes_per_day())
    assert all(not any(h.counts.values()) for h in outcomes_per_hour())


def test_the_empty_dashboard_renders(client_) -> None:
    r = client_.get(DASHBOARD)
    assert r.status_code == 200
    assert "Nothing in this window." in r.content.decode()


# --- find a user -------------------------------------------------------------------------


def test_find_goes_to_the_user_page(client_) -> None:
    r = client_.get(FIND, {"user_id": " 42 "})
    assert r.status_code == 302
    assert r["Location"] == user_url(42)


@pytest.mark.parametrize("raw", ["abc", "-1", "1.5", str(2**63), "", "x" * 500])
def test_a_bad_id_gives_a_message_not_an_error(client_, raw) -> None:
    r = client_.get(FIND, {"user_id": raw})
    assert r.status_code == 302 and r["Location"] == DASHBOARD
    [message] = shown_messages(r)
    assert "is not a user id" in message


@pytest.mark.parametrize("raw", ["abc", str(2**63), "%20"])
def test_a_bad_id_in_the_user_page_address_gives_a_message(client_, raw) -> None:
    for url in (user_url(raw), leave_url(raw), rejoin_url(raw)):
        r = client_.get(url)
        assert r.status_code == 302 and r["Location"] == DASHBOARD
        assert "is not a user id" in shown_messages(r)[0]
    assert client_.post(leave_url(raw)).status_code == 302
    assert written() == ([], 0, 0)


# --- the user page -----------------------------------------------------------------------


def test_user_page_shows_record_history_and_signals(client_, console_operator, signals_by_hour) -> None:
    leave_community_layer(user_id=1, actor=console_operator)
    r = client_.get(user_url(1))
    assert r.status_code == 200
    html = r.content.decode()
    assert re.search(r'id="record-status" class="status-left">left<', html)
    assert [row["action"] for row in r.context["history"]] == ["leave"]
    assert r.context["history"][0]["actor"] == console_operator.username
    outcomes = [s.get_outcome_display() for s in r.context["signals"]]
    ids = [s.id for s in r.context["signals"]]
    assert ids == sorted(ids, reverse=True)
    assert sorted(outcomes) == ["attributed", "attributed", "attributed", "pending"]
    assert html.count('class="signal-row"') == 4
    assert '<td class="outcome">pending</td>' in html
    assert 'id="rejoin-button"' in html and 'id="leave-button"' not in html


def test_user_page_of_a_gated_user_shows_gated_signals(client_, signals_by_hour) -> None:
    r = client_.get(user_url(2))
    assert [s.get_outcome_display() for s in r.context["signals"]] == ["gated"] * 4


def test_user_page_of_a_user_who_never_left(client_) -> None:
    r = client_.get(user_url(77))
    html = r.content.decode()
    assert r.context["status"] == "active"
    assert "no record: this user never left" in html
    assert "No changes recorded." in html and "No signals." in html
    assert 'id="leave-button"' in html and 'id="rejoin-button"' not in html


def test_user_page_of_a_corrupt_record(client_) -> None:
    CommunityLeave.objects.create(user_id=3, value=CORRUPT)
    r = client_.get(user_url(3))
    html = r.content.decode()
    assert r.context["status"] == "corrupt" and r.context["corrupt"]
    assert "07 07 07 07 07 07 07 07 07" in html
    assert 'id="leave-button"' in html and 'id="rejoin-button"' in html


def test_user_page_history_is_capped_newest_first(client_) -> None:
    for _ in range(51):
        leave_community_layer(user_id=9)
        rejoin_community_layer(user_id=9)
    r = client_.get(user_url(9))
    versions = [row["version"] for row in r.context["history"]]
    assert len(versions) == console_views.HISTORY_SHOWN == 100
    assert versions == sorted(LeaveHistory.objects.filter(user_id=9).values_list("version", flat=True))[-100:][::-1]
    assert "newest 100 of 102" in r.content.decode()


def test_user_page_signals_are_capped(client_) -> None:
    sender = UserFactory(perms=["signals_app.add_signal"])
    ingest(sender, *[sig(8) for _ in range(console_views.SIGNALS_SHOWN + 5)])
    assert len(client_.get(user_url(8)).context["signals"]) == console_views.SIGNALS_SHOWN


# --- leave and rejoin from the user page -------------------------------------------------


def test_the_leave_confirmation_page_writes_nothing(client_) -> None:
    r = client_.get(leave_url(7))
    assert r.status_code == 200
    assert 'id="confirm-button"' in r.content.decode() and "csrfmiddlewaretoken" in r.content.decode()
    assert written() == ([], 0, 0)


def test_leave_then_rejoin_from_the_user_page(client_, console_operator) -> None:
    r = client_.post(leave_url(7))
    assert r.status_code == 302 and r["Location"] == user_url(7)
    assert shown_messages(r) == ["User 7 is now left (version 1)."]
    assert CommunityLeave.objects.get(pk=7).membership.status == MembershipStatus.LEFT
    r = client_.post(rejoin_url(7))
    assert shown_messages(r)[-1] == "User 7 is now active (version 2)."
    entries = list(LeaveHistory.objects.filter(user_id=7).order_by("version"))
    assert [(e.action, e.source, e.actor_id, e.actor_label) for e in entries] == [
        ("leave", "admin", console_operator.pk, console_operator.username),
        ("rejoin", "admin", console_operator.pk, console_operator.username),
    ]
    assert LeaveClock.objects.get(pk=1).version == entries[-1].version


def test_posting_without_the_csrf_token_is_refused() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(is_staff=True, perms=OPERATOR_PERMS))
    assert client.post(leave_url(7)).status_code == 403
    assert client.post(BULK, {"user_ids": "7", "confirm": "1"}).status_code == 403
    assert written() == ([], 0, 0)


# --- bulk leave --------------------------------------------------------------------------


def test_the_bulk_leave_form_says_the_cap(client_) -> None:
    r = client_.get(BULK)
    assert r.status_code == 200
    assert "At most 10,000 distinct ids" in r.content.decode()


def test_bad_tokens_are_named_and_nothing_is_written(client_) -> None:
    r = client_.post(BULK, {"user_ids": "12, abc\n-5 13;1.5 99999999999999999999 9223372036854775807"})
    assert r.status_code == 200
    errors = r.context["form"].non_field_errors()
    assert errors == [
        "Not a user id: 'abc' (pasted, item 2): Must be an integer from 0 to 9223372036854775807.",
        "Not a user id: '-5' (pasted, item 3): Must be an integer from 0 to 9223372036854775807.",
        "Not a user id: '1.5' (pasted, item 5): Must be an integer from 0 to 9223372036854775807.",
        "Not a user id: '99999999999999999999' (pasted, item 6): Must be at most 9223372036854775807 (2**63-1).",
    ]
    html = r.content.decode()
    assert "&#x27;abc&#x27; (pasted, item 2)" in html and "Nothing was written." in html
    assert written() == ([], 0, 0)


def test_many_bad_tokens_are_summarised(client_) -> None:
    r = client_.post(BULK, {"user_ids": " ".join(f"x{i}" for i in range(25))})
    errors = r.context["form"].non_field_errors()
    assert len(errors) == forms.BAD_TOKENS_SHOWN + 1
    assert errors[-1] == "… and 5 more bad items."


@pytest.mark.parametrize("text", ["", "  \n , ", "user_id\n"])
def test_an_empty_list_is_refused(client_, text) -> None:
    r = client_.post(BULK, {"user_ids": text})
    assert r.context["form"].non_field_errors() == ["Paste or upload at least one user id."]


def test_the_cap_is_enforced(client_) -> None:
    ids = " ".join(str(i) for i in range(forms.BULK_MAX_IDS + 1))
    r = client_.post(BULK, {"user_ids": ids})
    assert r.context["form"].non_field_errors() == [
        "10,001 distinct ids: at most 10,000 at a time. Split the list and submit it in parts."
    ]
    assert written() == ([], 0, 0)


def test_the_check_step_shows_a_confirmation_and_writes_nothing(client_) -> None:
    leave_community_layer(user_id=12)
    state = written()
    r = client_.post(BULK, {"user_ids": "12 13, 14\n13\n" + "\n".join(str(i) for i in range(100, 130))})
    assert r.status_code == 200
    assert r.templates[0].name == "admin/community/console/bulk_leave_confirm.html"
    assert r.context["count"] == 33  # duplicates once
    assert r.context["sample"] == [12, 13, 14, *range(100, 117)]
    html = r.content.decode()
    assert '<strong id="bulk-count">33</strong>' in html and 'name="confirm"' in html
    assert written() == state


def test_an_uploaded_csv_file_is_read(client_) -> None:
    upload = SimpleUploadedFile("ids.csv", b'\xef\xbb\xbfuser_id\r\n"21"\r\n22\r\n', content_type="text/csv")
    r = client_.post(BULK, {"user_ids": "23 21", "file": upload})
    assert r.context["count"] == 3
    assert r.context["sample"] == [23, 21, 22]


def test_a_bad_token_in_a_file_is_named(client_) -> None:
    upload = SimpleUploadedFile("ids.txt", b"21\n22x\n", content_type="text/plain")
    r = client_.post(BULK, {"file": upload})
    assert r.context["form"].non_field_errors() == [
        "Not a user id: '22x' (file, item 2): Must be an integer from 0 to 9223372036854775807."
    ]


def test_a_file_that_is_not_utf8_or_too_large_is_refused(client_) -> None:
    r = client_.post(BULK, {"file": SimpleUploadedFile("ids.txt", b"\xff\xfe1\x00")})
    assert r.context["form"].errors["file"] == ["The file is not UTF-8 text."]
    big = SimpleUploadedFile("ids.txt", b"1\n" * (forms.BULK_MAX_FILE_BYTES // 2 + 1))
    r = client_.post(BULK, {"file": big})
    assert r.context["form"].errors["file"] == ["The file is larger than 1024 KiB."]
    assert written() == ([], 0, 0)


def test_confirm_makes_them_leave_in_chunks_with_source_admin(client_, console_operator, monkeypatch) -> None:
    leave_community_layer(user_id=5)
    version = LeaveClock.objects.get(pk=1).version
    calls: list[int] = []
    real = console_views.bulk_leave_community_layer

    def counting(**kwargs: Any) -> Any:
        calls.append(len(kwargs["user_ids"]))
        return real(**kwargs)

    monkeypatch.setattr(console_views, "bulk_leave_community_layer", counting)
    ids = list(range(1, 2501))
    r = client_.post(BULK, {"user_ids": " ".join(map(str, ids)), "confirm": "1"})
    assert r.status_code == 302 and r["Location"] == DASHBOARD
    assert shown_messages(r) == ["2,500 user(s) are now left (source: admin)."]
    assert calls == [1000, 1000, 500]
    new = LeaveHistory.objects.filter(version__gt=version)
    assert new.count() == 2499  # user 5 had already left
    assert set(new.values_list("action", "source", "actor_id", "actor_label")) == {
        ("leave", "admin", console_operator.pk, console_operator.username)
    }
    assert leave_record_counts().left == 2500
    assert LeaveClock.objects.get(pk=1).version == version + 2499


def test_a_database_error_midway_says_how_far_it_got(client_, monkeypatch) -> None:
    real = console_views.bulk_leave_community_layer
    calls: list[int] = []

    def failing_second(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise DatabaseError("connection lost")
        return real(**kwargs)

    monkeypatch.setattr(console_views, "bulk_leave_community_layer", failing_second)
    r = client_.post(BULK, {"user_ids": " ".join(str(i) for i in range(1, 1501)), "confirm": "1"})
    assert r.status_code == 200
    assert "The database failed after 1,000 of 1,500 ids" in shown_messages(r)[0]
    assert r.context["count"] == 1500  # the confirmation again, to finish
    assert leave_record_counts().left == 1000


def test_a_tampered_confirmation_is_checked_again(client_) -> None:
    r = client_.post(BULK, {"user_ids": "5 evil", "confirm": "1"})
    assert r.status_code == 200
    assert "Not a user id: 'evil' (pasted, item 2)" in r.context["form"].non_field_errors()[0]
    assert written() == ([], 0, 0)


def test_bulk_leave_results_show_on_the_dashboard(client_) -> None:
    client_.post(BULK, {"user_ids": "1 2 3", "confirm": "1"})
    r = client_.get(DASHBOARD)
    assert r.context["counts"].left_now == 3
    assert r.context["per_day"][-1].leaves == 3
    assert Outcome.GATED.label == "gated"  # the chart's legend names the outcomes by their labels
