"""An operator at work in a real browser (issue 4): log in, find a user, make them leave,
see the status and history change, and the dashboard count it. Screenshots for review
land in var/screenshots/<test name>/."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from community.membership import MembershipStatus
from community.models import Community, CommunityLeave, LeaveHistory
from community.services.groups import group_members_add
from community.services.layer import leave_community_layer, rejoin_community_layer
from signals_app.models import Signal
from signals_app.services.ingest import signals_ingest
from signals_app.services.processing import signals_process
from signals_app.validation import SignalIn
from tests.factories import UserFactory
from tests.helpers import log_in

# live_server serves from another thread: the data must be committed for it to see it.
pytestmark = pytest.mark.django_db(transaction=True)

USER = 4242
ALREADY_LEFT = 1001


def make_signals() -> None:
    """Signals of several outcomes over the last hours, so that the chart has bars."""
    sender = UserFactory(perms=["signals_app.add_signal"])
    group_members_add(group=Community.objects.create(slug="python", name="Python"), user_ids=[USER])
    now = timezone.now()

    def send(user_id: int, count: int, hours_ago: int) -> None:
        ids = signals_ingest(
            sender=sender, signals=[SignalIn(user_id, 7, "view", 1.0, now - timedelta(minutes=5), None)] * count
        ).signal_ids
        signals_process(signal_ids=ids)
        Signal.objects.filter(id__in=ids).update(processed_at=now - timedelta(hours=hours_ago))

    for hours_ago, count in ((0, 6), (1, 4), (3, 9), (6, 2), (12, 5)):
        send(USER, count, hours_ago)  # attributed (USER is in a community)
        send(ALREADY_LEFT, count // 2, hours_ago)  # gated
    send(555, 3, 2)  # no target


def status_cell(page: Page, user_id: int) -> Any:
    return page.locator("#result_list tr", has=page.locator(f"input[value='{user_id}']")).locator("td.field-status")


def test_operator_makes_a_user_leave_through_the_changelist_action(
    live_server, page: Page, shot, browser_operator, no_broker
) -> None:
    leave_community_layer(user_id=ALREADY_LEFT)
    leave_community_layer(user_id=USER)  # left once through the API, then came back
    rejoin_community_layer(user_id=USER)
    make_signals()

    log_in(page, live_server.url, "operator")
    expect(page.locator("#operator-console-module")).to_contain_text("Dashboard")
    shot("admin-index")

    # The dashboard before: one user left.
    page.click("#operator-console-module >> text=Dashboard")
    expect(page.locator("#users-left-now")).to_have_text("1")
    expect(page.locator("#outcomes-chart rect").first).to_be_visible()
    shot("dashboard-before")

    # Find the user in the leave records and make them leave with the admin action.
    page.goto(f"{live_server.url}/admin/community/communityleave/")
    page.fill("#searchbar", str(USER))
    page.press("#searchbar", "Enter")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(status_cell(page, USER)).to_have_text("active")
    shot("found-user")

    page.check(f"#result_list input[name=_selected_action][value='{USER}']")
    page.select_option("select[name=action]", "leave_selected")
    shot("action-chosen")
    page.click("button[name=index]")
    expect(page.locator("ul.messagelist")).to_contain_text("1 user(s) are now left.")
    expect(status_cell(page, USER)).to_have_text("left")
    shot("after-action")

    # The user page: status left, the admin's leave on top of the history.
    page.click("#result_list >> text=user page")
    expect(page.locator("#record-status")).to_have_text("left")
    history = page.locator("#history tr.history-row")
    expect(history).to_have_count(3)
    expect(history.nth(0).locator("td.action")).to_have_text("leave")
    expect(history.nth(0).locator("td.source")).to_have_text("admin")
    expect(history.nth(0).locator("td.actor")).to_have_text("operator")
    expect(history.nth(1).locator("td.action")).to_have_text("rejoin")
    expect(page.locator("#signals tr.signal-row").first.locator("td.outcome")).to_have_text("attributed")
    shot("user-page")

    # The dashboard counts it.
    page.click(".breadcrumbs >> text=Operator console")
    expect(page.locator("#users-left-now")).to_have_text("2")
    today = timezone.localdate().isoformat()
    expect(page.locator(f"#changes-table tr[data-day='{today}'] td.leaves")).to_have_text("3")
    shot("dashboard-after")

    assert CommunityLeave.objects.get(pk=USER).membership.status == MembershipStatus.LEFT
    newest = LeaveHistory.objects.filter(user_id=USER).first()
    assert newest is not None
    assert (newest.action, newest.source, newest.actor_id) == ("leave", "admin", browser_operator.pk)


def test_operator_finds_a_user_and_uses_the_buttons_of_the_user_page(
    live_server, page: Page, shot, browser_operator
) -> None:
    log_in(page, live_server.url, "operator")
    page.goto(f"{live_server.url}/admin/community/communityleave/console/")

    # A bad id is a message on the dashboard, not an error page.
    page.fill("#id_user_id", "12x")
    page.click("#find-user input[type=submit]")
    expect(page.locator("ul.messagelist")).to_contain_text("'12x' is not a user id")
    shot("bad-id")

    page.fill("#id_user_id", str(USER))
    page.click("#find-user input[type=submit]")
    expect(page.locator("#record-status")).to_have_text("active")
    expect(page.locator("#record-raw")).to_contain_text("never left")
    shot("user-never-left")

    page.click("#leave-button")
    expect(page.locator("#confirm-button")).to_be_visible()
    shot("leave-confirmation")
    assert not CommunityLeave.objects.filter(pk=USER).exists()  # asking wrote nothing
    page.click("#confirm-button")
    expect(page.locator("ul.messagelist")).to_contain_text(f"User {USER} is now left (version 1).")
    expect(page.locator("#record-status")).to_have_text("left")
    expect(page.locator("#history tr.history-row")).to_have_count(1)
    shot("user-left")

    page.click("#rejoin-button")
    page.click("#confirm-button")
    expect(page.locator("#record-status")).to_have_text("active")
    rows = page.locator("#history tr.history-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(0).locator("td.action")).to_have_text("rejoin")
    shot("user-rejoined")

    page.click(".breadcrumbs >> text=Operator console")
    expect(page.locator("#users-left-now")).to_have_text("0")
    expect(page.locator("#users-rejoined")).to_have_text("1")


def test_operator_bulk_leaves_a_pasted_list_after_confirming(live_server, page: Page, shot, browser_operator) -> None:
    log_in(page, live_server.url, "operator")
    page.click("#operator-console-module >> text=Bulk leave")
    page.fill("#id_user_ids", "101, 102\n103 oops 104")
    page.click("#check-button")
    expect(page.locator("ul.errorlist")).to_contain_text("'oops' (pasted, item 4)")
    shot("bulk-bad-token")

    page.fill("#id_user_ids", "101, 102\n103 104\n104")
    page.click("#check-button")
    expect(page.locator("#bulk-count")).to_have_text("4")
    expect(page.locator("#bulk-sample li")).to_have_count(4)
    shot("bulk-confirmation")
    assert not CommunityLeave.objects.exists()  # nothing written before the confirmation

    page.click("#confirm-button")
    page.wait_for_url(re.compile(r"/console/$"))
    expect(page.locator("ul.messagelist")).to_contain_text("4 user(s) are now left (source: admin).")
    expect(page.locator("#users-left-now")).to_have_text("4")
    shot("bulk-done-dashboard")
    assert set(LeaveHistory.objects.values_list("user_id", "source", "actor_id")) == {
        (user_id, "admin", browser_operator.pk) for user_id in (101, 102, 103, 104)
    }
