"""The Django admin of the leave records and their history (DESIGN.md section 7)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from community.display import rfc3339
from community.membership import MembershipStatus
from community.models import CommunityLeave, LeaveClock, LeaveHistory
from community.services.layer import leave_community_layer, rejoin_community_layer
from tests.factories import UserFactory
from tests.helpers import logged_in, shown_ids, written

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:community_communityleave_changelist")
ADD = reverse("admin:community_communityleave_add")
HISTORY_CHANGELIST = reverse("admin:community_leavehistory_changelist")
HISTORY_ADD = reverse("admin:community_leavehistory_add")
CORRUPT = b"\x07" * 9
LEFT_ID, ACTIVE_ID, CORRUPT_ID = 11, 12, 13


def change_url(user_id: int) -> str:
    return reverse("admin:community_communityleave_change", args=[user_id])


def delete_url(user_id: int) -> str:
    return reverse("admin:community_communityleave_delete", args=[user_id])


@pytest.fixture
def records() -> dict[int, CommunityLeave]:
    """One left, one rejoined (active with a left time) and one corrupt record."""
    leave_community_layer(user_id=LEFT_ID)
    leave_community_layer(user_id=ACTIVE_ID)
    rejoin_community_layer(user_id=ACTIVE_ID)
    CommunityLeave.objects.create(user_id=CORRUPT_ID, value=CORRUPT)
    return CommunityLeave.objects.in_bulk()


@pytest.fixture
def operator_client(operator) -> Client:
    return logged_in(operator)


# --- changelist: decoded columns, filter, search ---------------------------------------


def test_changelist_shows_decoded_status_left_time_and_hex(operator_client, records) -> None:
    r = operator_client.get(CHANGELIST)
    assert r.status_code == 200
    html = r.content.decode()
    left, active = records[LEFT_ID].membership, records[ACTIVE_ID].membership
    assert left is not None and active is not None
    assert rfc3339(left.left_at_ns) in html
    assert rfc3339(active.left_at_ns) in html
    for record in records.values():
        assert bytes(record.value).hex(" ") in html
    assert "07 07 07 07 07 07 07 07 07" in html
    assert "unreadable" in html
    for label in ("left", "active", "corrupt"):
        assert f'<td class="field-status">{label}</td>' in html


@pytest.mark.parametrize(
    ("status", "expected"),
    [("left", [LEFT_ID]), ("active", [ACTIVE_ID]), ("corrupt", [CORRUPT_ID]), ("", [LEFT_ID, ACTIVE_ID, CORRUPT_ID])],
)
def test_status_filter(operator_client, records, status, expected) -> None:
    r = operator_client.get(CHANGELIST, {"status": status} if status else {})
    assert r.status_code == 200
    assert shown_ids(r) == expected


@pytest.mark.parametrize(
    ("term", "expected"),
    [(str(LEFT_ID), [LEFT_ID]), (f" {CORRUPT_ID} ", [CORRUPT_ID]), ("abc", []), ("1.5", []), (str(2**63), [])],
)
def test_search_by_whole_user_id(operator_client, records, term, expected) -> None:
    r = operator_client.get(CHANGELIST, {"q": term})
    assert r.status_code == 200
    assert shown_ids(r) == expected


# --- actions ---------------------------------------------------------------------------


def run_action(client: Client, action: str, ids: list[int]) -> Any:
    return client.post(CHANGELIST, {"action": action, "_selected_action": [str(i) for i in ids]})


def test_leave_selected_goes_through_the_service(operator, operator_client, records) -> None:
    leave_community_layer(user_id=14)
    rejoin_community_layer(user_id=14)
    version = LeaveClock.objects.get(pk=1).version
    r = run_action(operator_client, "leave_selected", [ACTIVE_ID, 14, LEFT_ID])
    assert r.status_code == 302
    for user_id in (ACTIVE_ID, 14, LEFT_ID):
        assert CommunityLeave.objects.get(pk=user_id).membership.status == MembershipStatus.LEFT
    # The already-left record keeps its time and gets no history row.
    assert CommunityLeave.objects.get(pk=LEFT_ID).value == records[LEFT_ID].value
    new = LeaveHistory.objects.filter(version__gt=version)
    assert sorted(new.values_list("user_id", flat=True)) == [ACTIVE_ID, 14]
    assert {(h.action, h.source, h.actor_id, h.actor_label) for h in new} == {
        ("leave", "admin", operator.pk, operator.username)
    }
    assert LeaveClock.objects.get(pk=1).version == version + 2


def test_rejoin_selected_goes_through_the_service(operator, operator_client, records) -> None:
    version = LeaveClock.objects.get(pk=1).version
    r = run_action(operator_client, "rejoin_selected", [LEFT_ID, CORRUPT_ID, ACTIVE_ID])
    assert r.status_code == 302
    left_at = records[LEFT_ID].membership.left_at_ns
    assert CommunityLeave.objects.get(pk=LEFT_ID).membership == (LEFT_ID, MembershipStatus.ACTIVE, left_at)
    assert CommunityLeave.objects.get(pk=CORRUPT_ID).membership == (CORRUPT_ID, MembershipStatus.ACTIVE, None)
    new = LeaveHistory.objects.filter(version__gt=version)
    assert sorted(new.values_list("user_id", flat=True)) == [LEFT_ID, CORRUPT_ID]
    assert {(h.action, h.source, h.actor_id) for h in new} == {("rejoin", "admin", operator.pk)}
    assert LeaveClock.objects.get(pk=1).version == version + 2


def test_actions_offered_are_leave_and_rejoin_only(operator_client, records) -> None:
    choices = operator_client.get(CHANGELIST).context["action_form"].fields["action"].choices
    assert {name for name, _ in choices if name} == {"leave_selected", "rejoin_selected"}


def test_actions_need_the_change_permission(records) -> None:
    viewer = UserFactory(is_staff=True, perms=["community.view_communityleave"])
    client = logged_in(viewer)
    state = written()
    assert client.get(CHANGELIST).status_code == 200
    run_action(client, "leave_selected", [ACTIVE_ID])
    run_action(client, "rejoin_selected", [LEFT_ID])
    assert written() == state


# --- add form --------------------------------------------------------------------------


def test_add_form_makes_the_user_leave_through_the_service(operator, operator_client) -> None:
    r = operator_client.post(ADD, {"user_id": "21"})
    assert r.status_code == 302
    assert CommunityLeave.objects.get(pk=21).membership.status == MembershipStatus.LEFT
    entry = LeaveHistory.objects.get()
    assert (entry.user_id, entry.action, entry.source, entry.actor_id) == (21, "leave", "admin", operator.pk)
    assert LeaveClock.objects.get(pk=1).version == entry.version


def test_adding_an_existing_left_record_is_idempotent(operator_client, records) -> None:
    state = written()
    r = operator_client.post(ADD, {"user_id": str(LEFT_ID)})
    assert r.status_code == 302
    assert written() == state


def test_adding_an_existing_active_record_makes_the_user_leave_again(operator_client, records) -> None:
    r = operator_client.post(ADD, {"user_id": str(ACTIVE_ID)})
    assert r.status_code == 302
    record = CommunityLeave.objects.get(pk=ACTIVE_ID).membership
    assert record.status == MembershipStatus.LEFT
    assert record.left_at_ns > records[ACTIVE_ID].membership.left_at_ns


@pytest.mark.parametrize("raw", ["abc", "-1", str(2**63), "", "1.5"])
def test_add_form_rejects_a_bad_id_and_writes_nothing(operator_client, raw) -> None:
    r = operator_client.post(ADD, {"user_id": raw})
    assert r.status_code == 200
    assert "user_id" in r.context["adminform"].form.errors
    assert written() == ([], 0, 0)


# --- change and delete -----------------------------------------------------------------


def test_change_page_is_read_only(operator_client, records) -> None:
    r = operator_client.get(change_url(LEFT_ID))
    assert r.status_code == 200
    html = r.content.decode()
    assert 'name="_save"' not in html and 'name="_continue"' not in html
    assert bytes(records[LEFT_ID].value).hex(" ") in html
    assert not r.context["adminform"].form.fields  # nothing editable


def test_posting_the_change_page_changes_nothing(operator_client, records) -> None:
    state = written()
    operator_client.post(change_url(LEFT_ID), {"user_id": "999", "value": "00"})
    operator_client.post(change_url(LEFT_ID), {"user_id": "999", "_addanother": "1"})
    assert written() == state


@pytest.mark.parametrize("method", ["get", "post"])
def test_delete_is_refused(operator_client, superuser, records, method) -> None:
    state = written()
    for client in (operator_client, logged_in(superuser)):
        r = getattr(client, method)(delete_url(LEFT_ID), {"post": "yes"} if method == "post" else {})
        assert r.status_code == 403
    assert written() == state


# --- history admin ---------------------------------------------------------------------


@pytest.fixture
def history_reader() -> Any:
    return UserFactory(is_staff=True, perms=["community.view_leavehistory"])


def test_history_is_listed_and_viewable(history_reader, records) -> None:
    client = logged_in(history_reader)
    r = client.get(HISTORY_CHANGELIST)
    assert r.status_code == 200
    versions = [entry.version for entry in r.context["cl"].result_list]
    assert versions == sorted(LeaveHistory.objects.values_list("version", flat=True), reverse=True)
    entry = LeaveHistory.objects.first()
    r = client.get(reverse("admin:community_leavehistory_change", args=[entry.version]))
    assert r.status_code == 200
    assert bytes(entry.value).hex(" ") in r.content.decode()
    assert 'name="_save"' not in r.content.decode()


@pytest.mark.parametrize("who", ["history_reader", "superuser"])
def test_history_cannot_be_added_changed_or_deleted(request, records, who) -> None:
    client = logged_in(request.getfixturevalue(who))
    entry = LeaveHistory.objects.first()
    before = list(LeaveHistory.objects.values_list("version", "user_id", "action", "value", "source"))
    assert client.get(HISTORY_ADD).status_code == 403
    assert client.post(HISTORY_ADD, {"version": "99", "user_id": "1", "action": "leave"}).status_code == 403
    change = reverse("admin:community_leavehistory_change", args=[entry.version])
    assert client.post(change, {"user_id": "1", "action": "rejoin"}).status_code == 403
    delete = reverse("admin:community_leavehistory_delete", args=[entry.version])
    assert client.get(delete).status_code == 403
    assert client.post(delete, {"post": "yes"}).status_code == 403
    assert list(LeaveHistory.objects.values_list("version", "user_id", "action", "value", "source")) == before


# --- who may use the admin -------------------------------------------------------------


@pytest.mark.parametrize("url", [CHANGELIST, ADD, HISTORY_CHANGELIST])
def test_non_staff_user_with_permissions_is_sent_to_login(url) -> None:
    user = UserFactory(
        perms=["community.view_communityleave", "community.change_communityleave", "community.add_communityleave"]
    )
    r = logged_in(user).get(url)
    assert r.status_code == 302
    assert r["Location"].startswith(reverse("admin:login"))


def test_non_staff_user_cannot_run_actions(records) -> None:
    user = UserFactory(perms=["community.view_communityleave", "community.change_communityleave"])
    state = written()
    r = run_action(logged_in(user), "rejoin_selected", [LEFT_ID])
    assert r.status_code == 302 and r["Location"].startswith(reverse("admin:login"))
    assert written() == state


@pytest.mark.parametrize("url", [CHANGELIST, ADD, HISTORY_CHANGELIST])
def test_staff_without_community_permissions_gets_403(url) -> None:
    r = logged_in(UserFactory(is_staff=True)).get(url)
    assert r.status_code == 403
