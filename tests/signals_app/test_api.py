"""The signal, community and cohort REST API over DRF's APIClient: DESIGN.md sections 6 and 7."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from community.models import Cohort, CohortMember, Community, CommunityMember
from community.services.layer import leave_community_layer
from signals_app.models import Signal
from signals_app.services.processing import signals_process
from tests.factories import UserFactory
from tests.helpers import HOUR, as_client, ingest, join, sig

pytestmark = pytest.mark.django_db

SIGNALS = "/api/signals/"
COMMUNITIES = "/api/communities/"
COHORTS = "/api/cohorts/"
OK = {"user_id": 7, "item_id": 42, "kind": "view"}


def z(moment: Any) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def poster(sender) -> APIClient:
    return as_client(sender)


# --- POST /api/signals/ --------------------------------------------------------------------------


def test_posting_signals_needs_authentication(api) -> None:
    r = api.post(SIGNALS, {"signals": [OK]}, format="json")
    assert r.status_code == 401
    assert Signal.objects.count() == 0


def test_posting_signals_needs_the_add_signal_permission(member) -> None:
    r = as_client(member).post(SIGNALS, {"signals": [OK]}, format="json")
    assert r.status_code == 403
    assert Signal.objects.count() == 0


def test_posting_signals_answers_202_with_accepted_and_duplicates(poster, sender) -> None:
    body = {"signals": [{**OK, "idempotency_key": "a"}, {**OK, "idempotency_key": "b"}, OK]}
    r = poster.post(SIGNALS, body, format="json")
    assert r.status_code == 202
    assert r.json() == {"accepted": 3, "duplicates": 0, "suppressed": 0}
    again = poster.post(SIGNALS, {"signals": [{**OK, "idempotency_key": "a"}, OK]}, format="json")
    assert again.json() == {"accepted": 1, "duplicates": 1, "suppressed": 0}
    assert Signal.objects.filter(sender=sender).count() == 4


def test_posted_signals_are_stored_pending_with_their_fields(poster) -> None:
    at = HOUR + timedelta(minutes=3)
    body = {"signals": [{**OK, "weight": 2.5, "occurred_at": z(at).replace("Z", "+00:00"), "idempotency_key": "x"}]}
    assert poster.post(SIGNALS, body, format="json").status_code == 202
    s = Signal.objects.get()
    assert (s.user_id, s.item_id, s.kind, s.weight, s.occurred_at, s.idempotency_key, s.outcome) == (
        7,
        42,
        "view",
        2.5,
        at,
        "x",
        0,
    )


def test_a_token_account_may_post(sender) -> None:
    from tests.factories import api_token

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(sender)}")
    assert client.post(SIGNALS, {"signals": [OK]}, format="json").status_code == 202


def post_raw(client: APIClient, body: str) -> Any:
    return client.post(SIGNALS, data=body, content_type="application/json")


@pytest.mark.parametrize("body", ['{"signals": [', "[1, 2]", "null", '"signals"', "{'signals': []}"])
def test_malformed_or_non_object_bodies_are_400(poster, body: str) -> None:
    r = post_raw(poster, body)
    assert r.status_code == 400
    assert Signal.objects.count() == 0


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({**OK, "colour": "red"}, "colour"),
        ({**OK, "user_id": "seven"}, "user_id"),
        ({**OK, "user_id": True}, "user_id"),
        ({**OK, "item_id": 2**63}, "item_id"),
        ({**OK, "user_id": -1}, "user_id"),
        ({**OK, "kind": "Page-View"}, "kind"),
        ({**OK, "weight": "heavy"}, "weight"),
        ({**OK, "occurred_at": "2026-03-01T10:00:00"}, "occurred_at"),
        ({**OK, "idempotency_key": "k" * 129}, "idempotency_key"),
        ({"user_id": 7, "item_id": 42}, "kind"),
    ],
)
def test_a_bad_signal_is_named_by_index_and_field_and_nothing_is_stored(poster, item: dict, field: str) -> None:
    r = poster.post(SIGNALS, {"signals": [OK, OK, item]}, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["signals"]
    assert list(r.json()["signals"]) == ["2"]
    assert list(r.json()["signals"]["2"]) == [field]
    assert Signal.objects.count() == 0


@pytest.mark.parametrize("user_id", [2**63, 2**64, 10**30])
def test_an_id_too_large_is_named_as_too_large_whatever_its_size(poster, user_id: int) -> None:
    # orjson, which reads the bodies, would read ids past 64 bits as floats: "not an integer".
    r = poster.post(SIGNALS, {"signals": [{**OK, "user_id": user_id}]}, format="json")
    assert r.status_code == 400
    assert r.json()["signals"]["0"] == {"user_id": ["Must be at most 9223372036854775807 (2**63-1)."]}


def test_a_future_signal_beyond_the_clock_skew_is_400(poster, settings) -> None:
    from django.utils import timezone

    settings.SIGNAL_MAX_CLOCK_SKEW_SECONDS = 60
    soon, late = timezone.now() + timedelta(seconds=30), timezone.now() + timedelta(minutes=5)
    assert poster.post(SIGNALS, {"signals": [{**OK, "occurred_at": z(soon)}]}, format="json").status_code == 202
    r = poster.post(SIGNALS, {"signals": [{**OK, "occurred_at": z(late)}]}, format="json")
    assert r.status_code == 400
    assert list(r.json()["signals"]["0"]) == ["occurred_at"]


def test_huge_integer_weight_is_400_not_500(poster) -> None:
    body = '{"signals": [{"user_id": 7, "item_id": 42, "kind": "view", "weight": 1' + "0" * 400 + "}]}"
    r = post_raw(poster, body)
    assert r.status_code == 400
    assert list(r.json()["signals"]["0"]) == ["weight"]


@pytest.mark.parametrize("key", ["a\x00b", "\ud800"])
def test_an_idempotency_key_the_database_cannot_store_is_400_not_500(poster, key: str) -> None:
    # NUL cannot be stored in PostgreSQL text; a lone surrogate (JSON "\ud800") is not UTF-8 anywhere.
    r = post_raw(poster, json.dumps({"signals": [{**OK, "idempotency_key": key}]}))
    assert r.status_code == 400
    assert list(r.json()["signals"]["0"]) == ["idempotency_key"]
    assert Signal.objects.count() == 0


def test_occurred_at_out_of_the_calendar_in_utc_is_400_not_500(poster) -> None:
    r = poster.post(SIGNALS, {"signals": [{**OK, "occurred_at": "0001-01-01T00:00:00+01:00"}]}, format="json")
    assert r.status_code == 400
    assert list(r.json()["signals"]["0"]) == ["occurred_at"]


def test_1001_signals_are_400_and_1000_are_fine(poster) -> None:
    r = poster.post(SIGNALS, {"signals": [OK] * 1001}, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["signals"]
    assert Signal.objects.count() == 0
    assert poster.post(SIGNALS, {"signals": [OK] * 1000}, format="json").json() == {
        "accepted": 1000,
        "duplicates": 0,
        "suppressed": 0,
    }


def test_empty_batch_and_unknown_top_level_field_are_400(poster) -> None:
    assert list(poster.post(SIGNALS, {"signals": []}, format="json").json()) == ["signals"]
    assert list(poster.post(SIGNALS, {"signals": [OK], "more": 1}, format="json").json()) == ["more"]
    assert Signal.objects.count() == 0


def test_a_3_mb_body_is_413(poster) -> None:
    body = json.dumps({"signals": [{**OK, "idempotency_key": "k" * 120}] * 20_000})
    assert len(body) > 3_000_000
    r = post_raw(poster, body)
    assert r.status_code == 413
    assert Signal.objects.count() == 0


# --- communities and cohorts: create, list, read -------------------------------------------------


def test_creating_a_community_needs_add_community(member) -> None:
    r = as_client(member).post(COMMUNITIES, {"slug": "python", "name": "Python"}, format="json")
    assert r.status_code == 403
    assert not Community.objects.exists()


def test_creating_a_community_needs_authentication(api) -> None:
    assert api.post(COMMUNITIES, {"slug": "python", "name": "Python"}, format="json").status_code == 401


def test_creating_a_community_answers_201(db) -> None:
    client = as_client(UserFactory(perms=["community.add_community"]))
    r = client.post(COMMUNITIES, {"slug": "python-3_x", "name": "Python"}, format="json")
    assert r.status_code == 201
    assert r.json()["slug"] == "python-3_x" and r.json()["name"] == "Python" and r.json()["created_at"]
    assert Community.objects.get().slug == "python-3_x"


def test_a_duplicate_slug_is_400_on_slug(community) -> None:
    client = as_client(UserFactory(perms=["community.add_community"]))
    r = client.post(COMMUNITIES, {"slug": community.slug, "name": "Again"}, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["slug"]
    assert Community.objects.count() == 1


@pytest.mark.parametrize("slug", ["Python", "py thon", "p" * 65, "", "-python", "pyth/on", "pythön"])
def test_a_bad_slug_is_400_on_slug(db, slug: str) -> None:
    client = as_client(UserFactory(perms=["community.add_community"]))
    r = client.post(COMMUNITIES, {"slug": slug, "name": "x"}, format="json")
    assert r.status_code == 400
    assert "slug" in r.json()
    assert not Community.objects.exists()


def test_a_64_character_slug_is_fine(db) -> None:
    client = as_client(UserFactory(perms=["community.add_community"]))
    assert client.post(COMMUNITIES, {"slug": "p" * 64, "name": "x"}, format="json").status_code == 201


def test_community_list_is_paginated(member) -> None:
    for n in range(3):
        Community.objects.create(slug=f"c{n}", name=f"C{n}")
    r = as_client(member).get(COMMUNITIES, {"limit": 2})
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == 3 and body["next"] and body["previous"] is None
    assert [c["slug"] for c in body["results"]] == ["c0", "c1"]


def test_community_detail_and_unknown_slug(member, community) -> None:
    client = as_client(member)
    r = client.get(f"{COMMUNITIES}{community.slug}/")
    assert r.status_code == 200 and r.json()["name"] == community.name
    assert client.get(f"{COMMUNITIES}nope/").status_code == 404


def test_cohort_reads_need_view_cohort(member, cohort) -> None:
    client = as_client(member)
    assert client.get(COHORTS).status_code == 403
    assert client.get(f"{COHORTS}{cohort.slug}/").status_code == 403
    assert client.get(f"{COHORTS}{cohort.slug}/attribution/").status_code == 403
    reader = as_client(UserFactory(perms=["community.view_cohort"]))
    assert reader.get(COHORTS).json()["count"] == 1
    assert reader.get(f"{COHORTS}{cohort.slug}/").status_code == 200


def test_creating_a_cohort_needs_add_cohort(member) -> None:
    assert as_client(member).post(COHORTS, {"slug": "early", "name": "Early"}, format="json").status_code == 403
    client = as_client(UserFactory(perms=["community.add_cohort"]))
    assert client.post(COHORTS, {"slug": "early", "name": "Early"}, format="json").status_code == 201
    assert client.post(COHORTS, {"slug": "early", "name": "Again"}, format="json").status_code == 400
    assert Cohort.objects.count() == 1


# --- members ---------------------------------------------------------------------------------------

GROUPS = {
    "community": (COMMUNITIES, "community", CommunityMember),
    "cohort": (COHORTS, "cohort", CohortMember),
}


def group_of(kind: str) -> Any:
    model = Community if kind == "community" else Cohort
    return model.objects.create(slug=f"{kind}-1", name=kind)


def members_url(kind: str, group: Any) -> str:
    return f"{GROUPS[kind][0]}{group.slug}/members/"


def member_ids(kind: str, group: Any) -> list[int]:
    _, field, model = GROUPS[kind]
    return sorted(model.objects.filter(**{field: group}).values_list("user_id", flat=True))


def manager(kind: str) -> APIClient:
    """An account with every permission of the group and of its members."""
    perms = [f"community.{p}_{kind}" for p in ("add", "view", "delete")]
    perms += [f"community.{p}_{kind}member" for p in ("add", "delete")]
    return as_client(UserFactory(perms=perms))


@pytest.mark.parametrize("kind", ["community", "cohort"])
def test_adding_and_removing_members(db, kind: str) -> None:
    group, client = group_of(kind), manager(kind)
    url = members_url(kind, group)
    r = client.post(url, {"user_ids": [1, 2, 2, 3]}, format="json")
    assert (r.status_code, r.json()) == (200, {"added": 3, "already": 0})
    assert client.post(url, {"user_ids": [3, 4]}, format="json").json() == {"added": 1, "already": 1}
    assert member_ids(kind, group) == [1, 2, 3, 4]
    r = client.delete(url, {"user_ids": [1, 4, 9]}, format="json")
    assert (r.status_code, r.json()) == (200, {"removed": 2, "absent": 1})
    assert member_ids(kind, group) == [2, 3]


@pytest.mark.parametrize("kind", ["community", "cohort"])
def test_changing_members_needs_the_member_permissions(db, kind: str) -> None:
    group = group_of(kind)
    group_perms = [f"community.{p}_{kind}" for p in ("add", "view", "delete")]
    client = as_client(UserFactory(perms=group_perms))
    url = members_url(kind, group)
    assert client.post(url, {"user_ids": [1]}, format="json").status_code == 403
    assert client.delete(url, {"user_ids": [1]}, format="json").status_code == 403
    assert member_ids(kind, group) == []


@pytest.mark.parametrize("kind", ["community", "cohort"])
def test_member_permissions_alone_are_enough_to_change_members(db, kind: str) -> None:
    group = group_of(kind)
    url = members_url(kind, group)
    adder = as_client(UserFactory(perms=[f"community.add_{kind}member", f"community.view_{kind}"]))
    remover = as_client(UserFactory(perms=[f"community.delete_{kind}member", f"community.view_{kind}"]))
    assert adder.post(url, {"user_ids": [1, 2]}, format="json").status_code == 200
    assert adder.delete(url, {"user_ids": [1]}, format="json").status_code == 403
    assert remover.delete(url, {"user_ids": [1]}, format="json").status_code == 200
    assert remover.post(url, {"user_ids": [3]}, format="json").status_code == 403
    assert member_ids(kind, group) == [2]


def test_members_of_an_unknown_community_is_404(db) -> None:
    assert manager("community").post(f"{COMMUNITIES}nope/members/", {"user_ids": [1]}, format="json").status_code == 404


@pytest.mark.parametrize("kind", ["community", "cohort"])
@pytest.mark.parametrize(
    "body",
    [
        {"user_ids": [1, -1]},
        {"user_ids": [1, 2**63]},
        {"user_ids": [1, "x"]},
        {"user_ids": [True]},
        {"user_ids": [1.5]},
        {"user_ids": []},
        {"user_ids": list(range(1001))},
        {"user_ids": 1},
        {},
    ],
)
@pytest.mark.parametrize("method", ["post", "delete"])
def test_bad_member_ids_are_400_and_nothing_is_written(db, kind: str, body: dict, method: str) -> None:
    group, client = group_of(kind), manager(kind)
    url = members_url(kind, group)
    client.post(url, {"user_ids": [1]}, format="json")
    r = getattr(client, method)(url, body, format="json")
    assert r.status_code == 400
    assert list(r.json()) == ["user_ids"]
    assert member_ids(kind, group) == [1]


def test_a_bad_member_id_is_named_by_index(community) -> None:
    r = manager("community").post(members_url("community", community), {"user_ids": [1, 2, -3]}, format="json")
    assert list(r.json()["user_ids"]) == ["2"]


# --- trending and attribution --------------------------------------------------------------------


@pytest.fixture
def trending_data(sender, community, cohort) -> None:
    """Members 1 and 2 active, 3 left; signals in two hours, processed."""
    for user in (1, 2, 3):
        join(user, community, cohort)
    leave_community_layer(user_id=3)
    earlier = HOUR - timedelta(hours=1)
    signals = [
        sig(1, item_id=10, weight=1, at=HOUR + timedelta(minutes=5)),
        sig(2, item_id=10, weight=2, at=HOUR + timedelta(minutes=40)),
        sig(1, item_id=20, weight=5, at=HOUR + timedelta(minutes=1)),
        sig(1, item_id=30, weight=1, kind="like", at=HOUR + timedelta(minutes=2)),
        sig(2, item_id=30, weight=10, at=earlier + timedelta(minutes=30)),
        sig(3, item_id=40, weight=100, at=HOUR + timedelta(minutes=1)),  # gated
    ]
    signals_process(signal_ids=ingest(sender, *signals))


def top(client: APIClient, url: str, **params: Any) -> Any:
    r = client.get(url, params)
    assert r.status_code == 200, r.content
    return [(x["item_id"], x["kind"], x["count"], x["weight_sum"]) for x in r.json()["results"]]


@pytest.fixture
def reader(db) -> APIClient:
    return as_client(UserFactory(perms=["community.view_cohort"]))


TARGETS = [f"{COMMUNITIES}python/trending/", f"{COHORTS}early/attribution/"]


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_are_by_weight_sum_with_counts_and_sums(reader, trending_data, url: str) -> None:
    assert top(reader, url) == [(30, "view", 1, 10.0), (20, "view", 1, 5.0), (10, "view", 2, 3.0), (30, "like", 1, 1.0)]


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_last_at_is_the_latest_signal(reader, trending_data, url: str) -> None:
    results = reader.get(url).json()["results"]
    item_10 = next(x for x in results if x["item_id"] == 10)
    assert item_10["last_at"] == z(HOUR + timedelta(minutes=40))


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_kind_filter(reader, trending_data, url: str) -> None:
    assert top(reader, url, kind="like") == [(30, "like", 1, 1.0)]
    assert top(reader, url, kind="share") == []


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_window_is_by_hour_buckets(reader, trending_data, url: str) -> None:
    earlier = HOUR - timedelta(hours=1)
    # since is rounded down to its hour: the bucket starting at HOUR is in.
    in_hour = top(reader, url, since=z(HOUR + timedelta(minutes=30)))
    assert in_hour == [(20, "view", 1, 5.0), (10, "view", 2, 3.0), (30, "like", 1, 1.0)]
    # until: buckets starting before it.
    assert top(reader, url, until=z(HOUR)) == [(30, "view", 1, 10.0)]
    assert top(reader, url, since=z(earlier), until=z(earlier + timedelta(minutes=1))) == [(30, "view", 1, 10.0)]
    assert top(reader, url, since=z(HOUR + timedelta(hours=1))) == []


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_default_window_is_the_last_24_hours(reader, trending_data, sender, url: str) -> None:
    # A bucket that started more than 24 hours ago counts only when since reaches it.
    old = HOUR - timedelta(hours=30)
    signals_process(signal_ids=ingest(sender, sig(1, item_id=50, weight=1000, at=old + timedelta(minutes=5))))
    assert 50 not in [item for item, *_ in top(reader, url)]
    assert top(reader, url, since=z(old))[0] == (50, "view", 1, 1000.0)
    # until without since: the 24 hours before until.
    assert top(reader, url, until=z(old + timedelta(hours=1))) == [(50, "view", 1, 1000.0)]
    assert top(reader, url, until=z(old + timedelta(hours=24))) == [(50, "view", 1, 1000.0)]
    assert top(reader, url, until=z(old + timedelta(hours=25))) == []


@pytest.mark.parametrize("url", TARGETS)
def test_top_items_limit(reader, trending_data, url: str) -> None:
    assert top(reader, url, limit=2) == [(30, "view", 1, 10.0), (20, "view", 1, 5.0)]
    assert len(top(reader, url, limit=100)) == 4
    assert len(top(reader, url, limit=1)) == 1


@pytest.mark.parametrize("url", TARGETS)
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"since": "2026-03-01T10:00:00Z", "until": "2026-03-01T10:00:00Z"}, "until"),
        ({"since": "2026-03-01T11:00:00Z", "until": "2026-03-01T10:00:00Z"}, "until"),
        ({"kind": "Like"}, "kind"),
    ],
)
def test_top_items_bad_query_is_400_naming_the_field(reader, trending_data, url: str, params: dict, field: str) -> None:
    r = reader.get(url, params)
    assert r.status_code == 400
    assert field in r.json()


def test_trending_of_an_unknown_community_is_404(member) -> None:
    assert as_client(member).get(f"{COMMUNITIES}nope/trending/").status_code == 404


# --- a user's signals ------------------------------------------------------------------------------


def user_signals_url(user_id: Any) -> str:
    return f"/api/community-layer/{user_id}/signals/"


def test_own_signals_with_outcomes_newest_first(sender, member, community) -> None:
    uid = member.pk
    join(uid, community)
    attributed = ingest(sender, sig(uid, item_id=1))
    signals_process(signal_ids=attributed)
    leave_community_layer(user_id=uid)
    gated = ingest(sender, sig(uid, item_id=2))
    signals_process(signal_ids=gated)
    CommunityMember.objects.filter(user_id=uid).delete()
    from community.services.layer import rejoin_community_layer

    rejoin_community_layer(user_id=uid)
    no_target = ingest(sender, sig(uid, item_id=3))
    signals_process(signal_ids=no_target)
    ingest(sender, sig(uid, item_id=4))  # pending
    ingest(sender, sig(uid + 1000, item_id=5))  # someone else's
    r = as_client(member).get(user_signals_url(uid))
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == 4
    assert [(s["item_id"], s["outcome"]) for s in body["results"]] == [
        (4, "pending"),
        (3, "no_target"),
        (2, "gated"),
        (1, "attributed"),
    ]
    assert body["results"][0]["processed_at"] is None and body["results"][1]["processed_at"]


def test_own_signals_are_paginated(sender, member) -> None:
    ids = ingest(sender, *(sig(member.pk, item_id=i) for i in range(5)))
    client = as_client(member)
    first = client.get(user_signals_url(member.pk), {"limit": 2}).json()
    assert first["count"] == 5 and first["next"]
    assert [s["id"] for s in first["results"]] == [ids[4], ids[3]]
    second = client.get(first["next"]).json()
    assert [s["id"] for s in second["results"]] == [ids[2], ids[1]]


def test_another_users_signals_are_403_without_view_signal(sender, member) -> None:
    ingest(sender, sig(member.pk + 1))
    assert as_client(member).get(user_signals_url(member.pk + 1)).status_code == 403
    auditor = as_client(UserFactory(perms=["signals_app.view_signal"]))
    r = auditor.get(user_signals_url(member.pk + 1))
    assert r.status_code == 200 and r.json()["count"] == 1


def test_user_signals_need_authentication(api) -> None:
    assert api.get(user_signals_url(1)).status_code == 401


@pytest.mark.parametrize("bad", ["abc", "-1", str(2**63), "1.0", "%201"])
def test_user_signals_bad_id_is_400(member, bad: str) -> None:
    r = as_client(member).get(user_signals_url(bad))
    assert r.status_code == 400
    assert "user_id" in r.json()
