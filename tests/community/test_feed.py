"""Reasons, the change feed, the status list and the CSV export (issue: downstream)."""

from __future__ import annotations

import csv
import io
import threading
import time
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from community.membership import MembershipStatus, serialize_membership
from community.models import ChangeSource, CommunityLeave, LeaveClock, LeaveHistory
from community.selectors import community_layer_changes
from community.services.layer import bulk_leave_community_layer, leave_community_layer, rejoin_community_layer
from tests.factories import UserFactory

BASE = "/api/community-layer"
FEED = f"{BASE}/changes/"
CORRUPT = b"\x07" * 9


@pytest.fixture
def reader_api(operator: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(operator)
    return client


# --- reason ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_leave_and_rejoin_store_the_reason_shown_in_history_and_feed(reader_api: APIClient) -> None:
    r = reader_api.post(f"{BASE}/5/leave/", {"reason": "  asked by email  "}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "left"
    r = reader_api.post(f"{BASE}/5/rejoin/", {"reason": "changed their mind"}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "active"
    reader_api.post(f"{BASE}/6/leave/")  # no body: no reason
    assert list(LeaveHistory.objects.order_by("version").values_list("reason", flat=True)) == [
        "asked by email",
        "changed their mind",
        "",
    ]
    history = reader_api.get(f"{BASE}/5/history/").json()["results"]
    assert [e["reason"] for e in history] == ["changed their mind", "asked by email"]
    feed = reader_api.get(FEED).json()["results"]
    assert [(c["user_id"], c["action"], c["reason"]) for c in feed] == [
        (5, "leave", "asked by email"),
        (5, "rejoin", "changed their mind"),
        (6, "leave", ""),
    ]


@pytest.mark.django_db
def test_a_reason_over_500_characters_is_a_400_naming_the_field(reader_api: APIClient) -> None:
    for path in (f"{BASE}/5/leave/", f"{BASE}/5/rejoin/"):
        r = reader_api.post(path, {"reason": "x" * 501}, format="json")
        assert r.status_code == 400
        assert "reason" in r.json() and "500" in r.json()["reason"][0]
    r = reader_api.post(f"{BASE}/bulk-leave/", {"user_ids": [1], "reason": "x" * 501}, format="json")
    assert r.status_code == 400 and "reason" in r.json()
    r = reader_api.post(f"{BASE}/5/leave/", {"reason": ["not", "text"]}, format="json")
    assert r.status_code == 400 and "reason" in r.json()
    assert not LeaveHistory.objects.exists()
    assert reader_api.post(f"{BASE}/5/leave/", {"reason": "y" * 500}, format="json").status_code == 200


@pytest.mark.django_db
def test_the_service_refuses_a_long_reason_and_bulk_leave_keeps_it() -> None:
    with pytest.raises(ValueError, match="reason"):
        leave_community_layer(user_id=1, reason="z" * 501)
    bulk_leave_community_layer(user_ids=[1, 2], reason="spam wave", source=ChangeSource.COMMAND)
    assert set(LeaveHistory.objects.values_list("reason", flat=True)) == {"spam wave"}


@pytest.mark.django_db
def test_the_console_takes_a_reason(client: Any, superuser: Any) -> None:
    client.force_login(superuser)
    r = client.post("/admin/community/communityleave/console/user/9/leave/", {"reason": "operator said so"})
    assert r.status_code == 302
    assert LeaveHistory.objects.get().reason == "operator said so"
    page = client.get("/admin/community/leavehistory/")
    assert b"operator said so" in page.content


# --- the feed ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_feed_pages_in_version_order_with_a_cursor(reader_api: APIClient) -> None:
    for uid in range(7):
        leave_community_layer(user_id=uid)
    rejoin_community_layer(user_id=3, reason="r")
    seen: list[int] = []
    after = 0
    pages = 0
    while True:
        body = reader_api.get(FEED, {"after": after, "limit": 3}).json()
        pages += 1
        seen += [c["version"] for c in body["results"]]
        assert body["clock_version"] == 8
        assert f"after={body['next_after']}" in body["next"]
        if not body["has_more"]:
            break
        after = body["next_after"]
    assert seen == list(range(1, 9)) and pages == 3
    last = reader_api.get(FEED, {"after": 8}).json()
    assert last["results"] == [] and last["next_after"] == 8 and last["has_more"] is False
    change = reader_api.get(FEED, {"after": 7}).json()["results"][0]
    assert change["user_id"] == 3 and change["action"] == "rejoin" and change["status"] == "active"
    assert set(change) == {
        "version",
        "user_id",
        "action",
        "status",
        "left_at",
        "left_at_ns",
        "at",
        "actor",
        "source",
        "reason",
    }
    assert change["left_at_ns"] is not None and change["left_at"].endswith("Z")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"after": -1}, "after"),
        ({"after": "x"}, "after"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"wait": 999}, "wait"),
        ({"wait": "nan"}, "wait"),
        ({"wait": -1}, "wait"),
    ],
)
def test_bad_feed_parameters_are_a_400_naming_them(reader_api: APIClient, params: dict[str, Any], field: str) -> None:
    r = reader_api.get(FEED, params)
    assert r.status_code == 400 and field in r.json()


@pytest.mark.django_db
def test_the_feed_needs_the_read_permission(api: APIClient, member: Any) -> None:
    assert api.get(FEED).status_code == 401
    api.force_authenticate(member)
    assert api.get(FEED).status_code == 403
    assert api.get(f"{BASE}/").status_code == 403
    assert api.get(f"{BASE}/export/").status_code == 403


@pytest.mark.django_db(transaction=True)
def test_the_feed_waits_for_the_next_change(operator: Any) -> None:
    client = APIClient()
    client.force_authenticate(operator)
    leave_community_layer(user_id=1)

    def later() -> None:
        time.sleep(0.5)
        leave_community_layer(user_id=2, reason="late")
        connection.close()

    writer = threading.Thread(target=later)
    writer.start()
    body = client.get(FEED, {"after": 1, "wait": 10}).json()
    writer.join()
    assert [(c["version"], c["user_id"], c["reason"]) for c in body["results"]] == [(2, 2, "late")]


@pytest.mark.django_db(transaction=True)
def test_the_feed_has_no_gaps_under_concurrent_writers() -> None:
    """Four writers leave and rejoin overlapping users while a reader follows the feed with
    small pages: every page continues exactly where the last ended, and the reader ends with
    every version 1..N once, matching the history."""
    writers, per_writer = 4, 40
    done = threading.Event()
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            for step in range(per_writer):
                uid = (index * 7 + step) % 10
                if step % 2:
                    rejoin_community_layer(user_id=uid, reason=f"w{index}")
                else:
                    leave_community_layer(user_id=uid, reason=f"w{index}")
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    read: list[int] = []

    def follow() -> None:
        after = 0
        try:
            while True:
                finished = done.is_set()
                page = [entry.version for entry in community_layer_changes(after=after, limit=5)]
                assert page == list(range(after + 1, after + 1 + len(page))), (after, page)
                read.extend(page)
                if page:
                    after = page[-1]
                elif finished:
                    return
        except Exception as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            connection.close()

    reader = threading.Thread(target=follow)
    reader.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()
    assert not errors, errors
    clock = LeaveClock.objects.get(pk=1).version
    assert clock > 0
    assert read == list(range(1, clock + 1))
    assert read == list(LeaveHistory.objects.order_by("version").values_list("version", flat=True))


# --- the list and the export --------------------------------------------------------------


def _records() -> dict[str, list[int]]:
    left = [3, 10, 11, 40, 41]
    active = [5, 12]
    corrupt = [7, 42]
    for uid in left:
        CommunityLeave.objects.create(user_id=uid, value=serialize_membership_for(uid, MembershipStatus.LEFT))
    for uid in active:
        CommunityLeave.objects.create(user_id=uid, value=serialize_membership_for(uid, MembershipStatus.ACTIVE))
    for uid in corrupt:
        CommunityLeave.objects.create(user_id=uid, value=CORRUPT)
    return {"left": left, "active": active, "corrupt": corrupt}


def serialize_membership_for(uid: int, status: MembershipStatus) -> bytes:
    from community.membership import CommunityMembership

    return serialize_membership(CommunityMembership(uid, status, 1_700_000_000_000_000_000 + uid))


@pytest.mark.django_db
def test_the_list_pages_by_cursor_for_each_status(reader_api: APIClient) -> None:
    expected = _records()
    expected["all"] = sorted(uid for ids in expected.values() for uid in ids)
    for status, ids in expected.items():
        params: dict[str, Any] = {"limit": 2} | ({} if status == "all" else {"status": status})
        url: str | None = f"{BASE}/"
        seen: list[dict[str, Any]] = []
        first = True
        while url:
            r = reader_api.get(url, params if first else None)
            first = False
            assert r.status_code == 200, r.content
            body = r.json()
            assert len(body["results"]) <= 2
            seen += body["results"]
            url = body["next"]
        assert [s["user_id"] for s in seen] == sorted(ids), status
        if status == "corrupt":
            assert all(s["corrupt"] and s["status"] == "left" for s in seen)
        if status == "active":
            assert all(s["status"] == "active" and s["left_at_ns"] for s in seen)


@pytest.mark.django_db
def test_a_cursor_survives_inserts_before_it(reader_api: APIClient) -> None:
    _records()
    page = reader_api.get(f"{BASE}/", {"status": "left", "limit": 2}).json()
    assert [s["user_id"] for s in page["results"]] == [3, 10]
    CommunityLeave.objects.create(user_id=1, value=serialize_membership_for(1, MembershipStatus.LEFT))
    rest = reader_api.get(page["next"]).json()
    assert [s["user_id"] for s in rest["results"]] == [11, 40]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "gone"}, "status"),
        ({"cursor": "garbage"}, "cursor"),
        ({"limit": 0}, "limit"),
        ({"limit": "x"}, "limit"),
    ],
)
def test_bad_list_parameters_are_a_400(reader_api: APIClient, params: dict[str, Any], field: str) -> None:
    r = reader_api.get(f"{BASE}/", params)
    assert r.status_code == 400 and field in r.json()


def _csv_rows(response: Any) -> list[dict[str, str]]:
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.django_db
def test_the_export_streams_csv_of_each_status(reader_api: APIClient) -> None:
    expected = _records()
    for status, ids in expected.items():
        r = reader_api.get(f"{BASE}/export/", {"status": status})
        assert r.status_code == 200 and r["Content-Type"] == "text/csv" and r.streaming
        assert f"community-layer-{status}-" in r["Content-Disposition"]
        rows = _csv_rows(r)
        assert [int(row["user_id"]) for row in rows] == sorted(ids)
        for row in rows:
            assert row["corrupt"] == ("true" if status == "corrupt" else "false")
            assert row["status"] == ("left" if status in ("left", "corrupt") else "active")
    all_rows = _csv_rows(reader_api.get(f"{BASE}/export/"))
    assert len(all_rows) == 9
    assert reader_api.get(f"{BASE}/export/", {"status": "x"}).status_code == 400


@pytest.mark.django_db
def test_the_admin_export_button(client: Any, superuser: Any) -> None:
    _records()
    client.force_login(superuser)
    listing = client.get("/admin/community/communityleave/?status=left")
    assert b'id="export-csv"' in listing.content and b"export.csv?status=left" in listing.content
    rows = _csv_rows(client.get("/admin/community/communityleave/console/export.csv?status=left"))
    assert [int(row["user_id"]) for row in rows] == [3, 10, 11, 40, 41]
    member = UserFactory(is_staff=True)
    client.force_login(member)
    assert client.get("/admin/community/communityleave/console/export.csv").status_code == 403
