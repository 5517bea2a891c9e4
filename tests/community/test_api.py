"""The community-layer REST API over DRF's APIClient: DESIGN.md section 7."""

from __future__ import annotations

import calendar
import json
import re
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote

import pytest
from django.test import RequestFactory
from rest_framework.test import APIClient

from community.membership import MembershipStatus, serialize_membership
from community.models import CommunityLeave, LeaveHistory
from community.services.layer import leave_community_layer
from tests.factories import UserFactory, api_token, service_account
from tests.helpers import as_client, written

pytestmark = pytest.mark.django_db

BASE = "/api/community-layer"
BULK = f"{BASE}/bulk-leave/"
READ_ANY = "community.view_communityleave"
CHANGE_ANY = "community.change_communityleave"
RFC3339_NS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z$")
CORRUPT = b"\x07" * 9

# The four per-user endpoints: (method, path template).
STATUS = ("get", "{}/")
LEAVE = ("post", "{}/leave/")
REJOIN = ("post", "{}/rejoin/")
HISTORY = ("get", "{}/history/")
PER_USER = {"status": STATUS, "leave": LEAVE, "rejoin": REJOIN, "history": HISTORY}


def call(client: APIClient, endpoint: tuple[str, str], user_id: Any) -> Any:
    method, template = endpoint
    return getattr(client, method)(f"{BASE}/{template.format(user_id)}")


def bulk(client: APIClient, body: Any) -> Any:
    return client.post(BULK, body, format="json")


def hit(client: APIClient, endpoint: str, user_id: int) -> Any:
    """One of the four per-user endpoints by name, or bulk-leave of ``user_id``."""
    if endpoint == "bulk-leave":
        return bulk(client, {"user_ids": [user_id]})
    return call(client, PER_USER[endpoint], user_id)


def rfc3339_to_ns(stamp: str) -> int:
    seconds = calendar.timegm(datetime.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S").timetuple())
    return seconds * 1_000_000_000 + int(stamp[20:29])


# --- status, leave, rejoin -------------------------------------------------------------


def test_status_of_a_user_without_record_is_active(api, member) -> None:
    api.force_authenticate(member)
    r = call(api, STATUS, member.pk)
    assert r.status_code == 200
    assert r.json() == {"user_id": member.pk, "status": "active", "left_at": None, "left_at_ns": None, "corrupt": False}


def test_status_read_is_one_query(api, member, django_assert_num_queries) -> None:
    # community_layer_status promises one primary-key query (a user reading their own id).
    leave_community_layer(user_id=member.pk)
    api.force_authenticate(member)
    with django_assert_num_queries(1):
        r = call(api, STATUS, member.pk)
    assert r.json()["status"] == "left"


def test_leave_answers_left_with_a_nanosecond_rfc3339_time(api, member) -> None:
    api.force_authenticate(member)
    before = time.time_ns()
    r = call(api, LEAVE, member.pk)
    after = time.time_ns()
    assert r.status_code == 200
    body = r.json()
    assert (body["user_id"], body["status"], body["corrupt"]) == (member.pk, "left", False)
    assert RFC3339_NS.match(body["left_at"]), body["left_at"]
    assert before <= body["left_at_ns"] <= after
    assert rfc3339_to_ns(body["left_at"]) == body["left_at_ns"]
    assert body.pop("version") == 1
    assert call(api, STATUS, member.pk).json() == body


def test_second_leave_keeps_the_first_left_at(api, member) -> None:
    api.force_authenticate(member)
    first = call(api, LEAVE, member.pk).json()
    state = written()
    second = call(api, LEAVE, member.pk)
    assert second.status_code == 200
    assert second.json() == first
    assert written() == state


def test_rejoin_is_active_and_keeps_left_at(api, member) -> None:
    api.force_authenticate(member)
    left = call(api, LEAVE, member.pk).json()
    r = call(api, REJOIN, member.pk)
    assert r.status_code == 200
    body = r.json()
    assert body == {**left, "status": "active", "version": left["version"] + 1}
    del body["version"]  # a status read carries no version
    assert call(api, STATUS, member.pk).json() == body


def test_rejoin_while_active_changes_nothing(api, member) -> None:
    api.force_authenticate(member)
    call(api, LEAVE, member.pk)
    active = call(api, REJOIN, member.pk).json()
    state = written()
    again = call(api, REJOIN, member.pk)
    assert again.status_code == 200
    assert again.json() == active
    assert written() == state


def test_rejoin_without_record_writes_nothing(api, member) -> None:
    api.force_authenticate(member)
    r = call(api, REJOIN, member.pk)
    assert r.status_code == 200
    assert r.json()["status"] == "active"
    assert written() == ([], 0, 0)


def test_largest_user_id_is_accepted(api, operator) -> None:
    api.force_authenticate(operator)
    top = 2**63 - 1
    assert call(api, STATUS, top).json()["user_id"] == top
    r = call(api, LEAVE, top)
    assert r.status_code == 200
    assert (r.json()["user_id"], r.json()["status"]) == (top, "left")
    assert CommunityLeave.objects.filter(pk=top).exists()


# --- history ---------------------------------------------------------------------------


def test_history_is_paginated_newest_first_with_every_field(api, member) -> None:
    api.force_authenticate(member)
    first = call(api, LEAVE, member.pk).json()
    call(api, REJOIN, member.pk)
    last = call(api, LEAVE, member.pk).json()
    r = call(api, HISTORY, member.pk)
    assert r.status_code == 200
    page = r.json()
    assert set(page) == {"count", "next", "previous", "results"}
    assert (page["count"], page["next"], page["previous"]) == (3, None, None)
    entries = page["results"]
    fields = {"version", "action", "status", "left_at_ns", "actor", "source", "at", "reason"}
    receipt = {"signals_removed", "aggregate_rows_changed"}  # an erasure's counts, null for others
    assert all(set(e) == fields | receipt and all(e[k] is None for k in receipt) for e in entries)
    versions = [e["version"] for e in entries]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == 3
    assert [(e["action"], e["status"], e["left_at_ns"]) for e in entries] == [
        ("leave", "left", last["left_at_ns"]),
        ("rejoin", "active", first["left_at_ns"]),
        ("leave", "left", first["left_at_ns"]),
    ]
    assert {(e["actor"], e["source"]) for e in entries} == {(member.username, "api")}
    assert all(datetime.fromisoformat(e["at"]).tzinfo is not None for e in entries)


def test_history_pages_with_limit_and_offset(api, member) -> None:
    api.force_authenticate(member)
    for endpoint in (LEAVE, REJOIN, LEAVE):
        call(api, endpoint, member.pk)
    first = api.get(f"{BASE}/{member.pk}/history/?limit=2").json()
    assert first["count"] == 3 and len(first["results"]) == 2
    assert first["previous"] is None and first["next"]
    second = api.get(first["next"]).json()
    assert len(second["results"]) == 1 and second["next"] is None
    all_versions = [e["version"] for e in first["results"] + second["results"]]
    assert all_versions == sorted(all_versions, reverse=True)


def test_no_op_leaves_and_rejoins_add_no_history(api, member) -> None:
    api.force_authenticate(member)
    for endpoint in (REJOIN, LEAVE, LEAVE, REJOIN, REJOIN):
        assert call(api, endpoint, member.pk).status_code == 200
    assert [e["action"] for e in call(api, HISTORY, member.pk).json()["results"]] == ["rejoin", "leave"]


def test_history_names_the_operator_who_acted_even_after_the_account_is_deleted(api, operator, member) -> None:
    api.force_authenticate(operator)
    call(api, LEAVE, member.pk)
    name = operator.username
    operator.delete()
    api.force_authenticate(member)
    (entry,) = call(api, HISTORY, member.pk).json()["results"]
    assert (entry["actor"], entry["source"]) == (name, "api")


# --- bulk leave ------------------------------------------------------------------------


def test_bulk_leave_answers_in_input_order_and_writes_history(api, operator) -> None:
    leave_community_layer(user_id=7)
    kept = CommunityLeave.objects.get(pk=7).membership
    api.force_authenticate(operator)
    r = bulk(api, {"user_ids": [9, 7, "8", 9]})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [(s["user_id"], s["status"], s["corrupt"]) for s in results] == [
        (9, "left", False),
        (7, "left", False),
        (8, "left", False),
        (9, "left", False),
    ]
    assert results[1]["left_at_ns"] == kept.left_at_ns  # already left: first time kept
    assert results[0] == results[3]
    assert all(RFC3339_NS.match(s["left_at"]) for s in results)
    new_rows = LeaveHistory.objects.exclude(user_id=7)
    assert sorted(new_rows.values_list("user_id", flat=True)) == [8, 9]
    assert {(h.action, h.source, h.actor_id) for h in new_rows} == {("leave", "api", operator.pk)}


def test_bulk_leave_takes_exactly_one_thousand_ids(api, operator) -> None:
    api.force_authenticate(operator)
    r = bulk(api, {"user_ids": list(range(1000))})
    assert r.status_code == 200
    assert len(r.json()["results"]) == 1000
    assert CommunityLeave.objects.count() == LeaveHistory.objects.count() == 1000


def test_bulk_leave_by_a_member_is_forbidden(api, member) -> None:
    api.force_authenticate(member)
    r = bulk(api, {"user_ids": [member.pk]})
    assert r.status_code == 403
    assert written() == ([], 0, 0)


@pytest.mark.parametrize("count", [0, 1001], ids=["empty", "1001"])
def test_bulk_leave_size_limits_name_user_ids(api, operator, count) -> None:
    api.force_authenticate(operator)
    r = bulk(api, {"user_ids": list(range(count))})
    assert r.status_code == 400
    assert list(r.json()) == ["user_ids"]
    assert written() == ([], 0, 0)


def test_bulk_leave_bad_id_names_its_index_and_writes_nothing(api, operator) -> None:
    leave_community_layer(user_id=1)
    state = written()
    api.force_authenticate(operator)
    r = bulk(api, {"user_ids": [2, 3, 4, "x", 5]})
    assert r.status_code == 400
    body = r.json()
    assert list(body) == ["user_ids"]
    assert list(body["user_ids"]) == ["3"]
    assert isinstance(body["user_ids"]["3"], list) and body["user_ids"]["3"]
    assert written() == state


@pytest.mark.parametrize(
    "body",
    [
        {"user_ids": "1"},
        {"user_ids": [True]},
        {"user_ids": [1.5]},
        {"user_ids": [1.0]},
        {"user_ids": ["x"]},
        {"user_ids": [None]},
        {"user_ids": [-1]},
        {"user_ids": [2**63]},
        {"user_ids": ["1e3"]},
        {"user_ids": {"a": 1}},
        {"user_ids": None},
        {},
    ],
    ids=repr,
)
def test_bulk_leave_wrong_types_are_400_naming_user_ids(api, operator, body) -> None:
    api.force_authenticate(operator)
    r = bulk(api, body)
    assert r.status_code == 400
    assert list(r.json()) == ["user_ids"]
    assert written() == ([], 0, 0)


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[1, 2, 3]", b"null", b'"1"', b"", b'{"user_ids": [1]'],
    ids=["not-json", "array", "null", "string", "empty", "truncated"],
)
def test_bulk_leave_malformed_bodies_are_400(api, operator, raw) -> None:
    api.force_authenticate(operator)
    r = api.post(BULK, raw, content_type="application/json")
    assert r.status_code == 400, r.content
    assert written() == ([], 0, 0)


@pytest.mark.parametrize(
    ("raw", "content_type"),
    [
        (json.dumps({"user_ids": [1], "pad": "x" * 3_000_000}).encode(), "application/json"),
        (("user_ids=1&pad=" + "x" * 3_000_000).encode(), "application/x-www-form-urlencoded"),
    ],
    ids=["json", "form"],
)
def test_oversized_bulk_body_is_413(api, operator, raw, content_type) -> None:
    api.force_authenticate(operator)
    r = api.post(BULK, raw, content_type=content_type)
    assert r.status_code == 413, r.content
    assert "detail" in r.json()
    assert written() == ([], 0, 0)


# --- authentication and authorization --------------------------------------------------


@pytest.mark.parametrize("endpoint", [*PER_USER, "bulk-leave"])
def test_anonymous_gets_401_everywhere(api, member, endpoint) -> None:
    leave_community_layer(user_id=member.pk)
    state = written()
    r = hit(api, endpoint, member.pk)
    assert r.status_code == 401
    assert "WWW-Authenticate" in r
    assert "status" not in r.json()
    assert written() == state


def _staff_without_perms() -> Any:
    return UserFactory(is_staff=True)


def _viewer() -> Any:
    return UserFactory(perms=[READ_ANY])


def _operator() -> Any:
    return UserFactory(is_staff=True, perms=[READ_ANY, CHANGE_ANY])


def _superuser() -> Any:
    return UserFactory(is_staff=True, is_superuser=True)


ACTORS = {
    "member": UserFactory,
    "staff-without-perms": _staff_without_perms,
    "view-only": _viewer,
    "operator": _operator,
    "superuser": _superuser,
}
# What each kind of account gets on ANOTHER user's id: status, leave, rejoin, history, bulk-leave.
ON_ANOTHER = {
    "member": (403, 403, 403, 403, 403),
    "staff-without-perms": (403, 403, 403, 403, 403),
    "view-only": (200, 403, 403, 200, 403),
    "operator": (200, 200, 200, 200, 200),
    "superuser": (200, 200, 200, 200, 200),
}
MATRIX = [
    (kind, endpoint, ON_ANOTHER[kind][i]) for kind in ON_ANOTHER for i, endpoint in enumerate([*PER_USER, "bulk-leave"])
]


@pytest.mark.parametrize(("kind", "endpoint", "expected"), MATRIX)
def test_access_to_another_users_id(kind, endpoint, expected) -> None:
    other = UserFactory()
    leave_community_layer(user_id=other.pk)  # so that a rejoin would write
    state = written()
    client = as_client(ACTORS[kind]())
    r = hit(client, endpoint, other.pk)
    assert r.status_code == expected, r.content
    if expected == 403:
        assert set(r.json()) == {"detail"}  # nothing of the other user's record
        assert written() == state


@pytest.mark.parametrize("endpoint", list(PER_USER))
def test_member_may_use_every_endpoint_on_their_own_id(api, member, endpoint) -> None:
    leave_community_layer(user_id=member.pk)
    api.force_authenticate(member)
    r = call(api, PER_USER[endpoint], member.pk)
    assert r.status_code == 200


def test_token_auth_works(api, member) -> None:
    api.credentials(HTTP_AUTHORIZATION=f"Token {api_token(member)}")
    assert call(api, LEAVE, member.pk).json()["status"] == "left"
    assert call(api, STATUS, member.pk).json()["status"] == "left"
    assert LeaveHistory.objects.get().actor_id == member.pk


def test_a_wrong_token_is_401(api, member) -> None:
    api_token(member)
    api.credentials(HTTP_AUTHORIZATION="Token " + "0" * 64)
    assert call(api, LEAVE, member.pk).status_code == 401
    assert written() == ([], 0, 0)


def test_session_auth_works(api, member) -> None:
    assert api.login(request=RequestFactory().post("/"), username=member.username, password="pw-for-tests")
    assert call(api, LEAVE, member.pk).json()["status"] == "left"
    assert call(api, STATUS, member.pk).json()["status"] == "left"


def test_session_write_without_csrf_token_is_refused(member) -> None:
    client = APIClient(enforce_csrf_checks=True)
    assert client.login(request=RequestFactory().post("/"), username=member.username, password="pw-for-tests")
    assert call(client, STATUS, member.pk).status_code == 200
    r = call(client, LEAVE, member.pk)
    assert r.status_code == 403
    assert written() == ([], 0, 0)


def test_token_write_needs_no_csrf_token(member) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(member)}")
    assert call(client, LEAVE, member.pk).status_code == 200


# --- bad path ids ----------------------------------------------------------------------

BAD_IDS = ["abc", "-1", str(2**63), "1.5", "1e3", " 1", "1 ", "\uff10", "\u0663", "1\n", "0x1", "+1", "1" * 21]


@pytest.mark.parametrize("endpoint", list(PER_USER))
@pytest.mark.parametrize("raw", BAD_IDS, ids=repr)
def test_bad_path_id_is_400_naming_user_id(api, operator, raw, endpoint) -> None:
    api.force_authenticate(operator)
    r = call(api, PER_USER[endpoint], quote(raw, safe=""))
    assert r.status_code == 400, r.content
    body = r.json()
    assert list(body) == ["user_id"]
    assert len(body["user_id"]) == 1 and isinstance(body["user_id"][0], str)
    assert written() == ([], 0, 0)


def test_bad_path_id_is_400_before_the_permission_check(api, member) -> None:
    api.force_authenticate(member)
    assert call(api, LEAVE, "abc").status_code == 400


# --- corrupt records -------------------------------------------------------------------


def test_corrupt_record_reads_as_left_and_corrupt(api, operator) -> None:
    CommunityLeave.objects.create(user_id=42, value=CORRUPT)
    api.force_authenticate(operator)
    r = call(api, STATUS, 42)
    assert r.status_code == 200
    assert r.json() == {"user_id": 42, "status": "left", "left_at": None, "left_at_ns": None, "corrupt": True}


def test_leave_on_a_corrupt_record_writes_a_clean_left_record(api, operator) -> None:
    CommunityLeave.objects.create(user_id=42, value=CORRUPT)
    api.force_authenticate(operator)
    r = call(api, LEAVE, 42)
    assert r.status_code == 200
    body = r.json()
    assert (body["status"], body["corrupt"]) == ("left", False) and body["left_at_ns"]
    record = CommunityLeave.objects.get(pk=42).membership
    assert record is not None and (record.status, record.left_at_ns) == (MembershipStatus.LEFT, body["left_at_ns"])
    assert body.pop("version") == 1
    assert call(api, STATUS, 42).json() == body
    assert LeaveHistory.objects.get().action == "leave"


def test_rejoin_on_a_corrupt_record_writes_a_clean_active_record(api, operator) -> None:
    CommunityLeave.objects.create(user_id=42, value=CORRUPT)
    api.force_authenticate(operator)
    r = call(api, REJOIN, 42)
    assert r.status_code == 200
    assert r.json() == {
        "user_id": 42,
        "status": "active",
        "left_at": None,
        "left_at_ns": None,
        "corrupt": False,
        "version": 1,
    }
    stored = CommunityLeave.objects.get(pk=42)
    assert bytes(stored.value) == serialize_membership(stored.membership) == bytes(9)
    assert LeaveHistory.objects.get().action == "rejoin"


# --- throttling ------------------------------------------------------------------------


@pytest.fixture
def low_rates(monkeypatch) -> None:
    monkeypatch.setattr(
        "tidalproject.api.WriteRateThrottle.THROTTLE_RATES", {"write": "3/minute", "service_write": "5/minute"}
    )


def test_writes_are_throttled_and_reads_are_not(api, member, low_rates) -> None:
    api.force_authenticate(member)
    for endpoint in (LEAVE, REJOIN, LEAVE):
        assert call(api, endpoint, member.pk).status_code == 200
    state = written()
    r = call(api, REJOIN, member.pk)
    assert r.status_code == 429
    assert "Retry-After" in r
    assert written() == state  # the throttled rejoin did not happen
    for _ in range(10):
        assert call(api, STATUS, member.pk).status_code == 200
        assert call(api, HISTORY, member.pk).status_code == 200
    assert call(api, STATUS, member.pk).json()["status"] == "left"


def test_write_throttle_is_per_account(member, low_rates) -> None:
    other = UserFactory()
    first, second = as_client(member), as_client(other)
    for _ in range(3):
        assert call(first, LEAVE, member.pk).status_code == 200
    assert call(first, LEAVE, member.pk).status_code == 429
    assert call(second, LEAVE, other.pk).status_code == 200


def test_service_accounts_have_their_own_higher_write_scope(member, low_rates) -> None:
    service = service_account()
    ordinary, svc = as_client(member), as_client(service)
    for _ in range(3):
        assert call(ordinary, LEAVE, member.pk).status_code == 200
    assert call(ordinary, LEAVE, member.pk).status_code == 429
    for _ in range(5):
        assert call(svc, LEAVE, service.pk).status_code == 200
    assert call(svc, LEAVE, service.pk).status_code == 429


def test_bulk_leave_is_throttled_as_a_write(api, operator, low_rates) -> None:
    api.force_authenticate(operator)
    for i in range(3):
        assert bulk(api, {"user_ids": [i]}).status_code == 200
    assert bulk(api, {"user_ids": [99]}).status_code == 429
    assert not CommunityLeave.objects.filter(pk=99).exists()


# --- schema and docs -------------------------------------------------------------------


def test_openapi_schema_lists_the_community_layer_paths(api) -> None:
    # Public on purpose (SPECTACULAR_SETTINGS SERVE_PERMISSIONS AllowAny): no account needed.
    r = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200
    schema = r.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    assert set(paths["/api/community-layer/{user_id}/"]) >= {"get"}
    assert set(paths["/api/community-layer/{user_id}/leave/"]) >= {"post"}
    assert set(paths["/api/community-layer/{user_id}/rejoin/"]) >= {"post"}
    assert set(paths["/api/community-layer/{user_id}/history/"]) >= {"get"}
    assert set(paths["/api/community-layer/bulk-leave/"]) >= {"post"}


def test_openapi_schema_default_is_yaml(api) -> None:
    r = api.get("/api/schema/")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("application/vnd.oai.openapi")
    assert b"/api/community-layer/{user_id}/leave/" in r.content


def test_docs_page_is_html_served_without_authentication(api) -> None:
    r = api.get("/api/docs/")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/html")
    html = r.content.decode()
    assert "<html" in html.lower() and '<script src="/api/docs/?script="></script>' in html
    # The set-up script is a file of its own (no inline script under the CSP); it loads the schema.
    script = api.get("/api/docs/?script=")
    assert script.status_code == 200 and "javascript" in script["Content-Type"]
    assert "/api/schema/" in script.content.decode()
