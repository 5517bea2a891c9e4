"""Admin lists on big tables: estimated and capped counts (tidalproject/paging.py), the kind
filter, the time windows, the console's estimated counts (BENCHMARKS.md, "Pages on big tables")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from community.membership import CommunityMembership, MembershipStatus, serialize_membership
from community.models import CommunityLeave, LeaveHistory
from community.selectors import leave_record_counts
from community.services.layer import leave_community_layer, rejoin_community_layer
from signals_app.models import Signal
from signals_app.selectors import signal_kinds
from tests.factories import UserFactory
from tests.helpers import ingest, logged_in, shown_ids, sig
from tidalproject import paging
from tidalproject.paging import EstimatedCountPaginator, estimated_rows

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="reltuples is PostgreSQL's")

RECORDS = reverse("admin:community_communityleave_changelist")
HISTORY = reverse("admin:community_leavehistory_changelist")
SIGNALS = reverse("admin:signals_app_signal_changelist")


def add_records(first: int, count: int, status: MembershipStatus = MembershipStatus.LEFT) -> None:
    CommunityLeave.objects.bulk_create(
        CommunityLeave(user_id=u, value=serialize_membership(CommunityMembership(u, status, 10**18)))
        for u in range(first, first + count)
    )


def analyze(model: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {model._meta.db_table}")


# --- the paginator --------------------------------------------------------------------------


@postgresql_only
def test_unfiltered_count_is_the_planners_estimate_past_the_threshold(monkeypatch) -> None:
    add_records(1, 30)
    analyze(CommunityLeave)
    monkeypatch.setattr(paging, "EXACT_BELOW", 10)
    add_records(100, 5)  # not analyzed: the estimate does not see them
    paginator = EstimatedCountPaginator(CommunityLeave.objects.order_by("-pk"), 10)
    assert estimated_rows(CommunityLeave) == 30
    assert paginator.count == 30
    assert paginator.estimated and not paginator.capped


@postgresql_only
def test_unfiltered_count_is_exact_below_the_threshold() -> None:
    add_records(1, 30)
    analyze(CommunityLeave)
    add_records(100, 5)
    paginator = EstimatedCountPaginator(CommunityLeave.objects.order_by("-pk"), 10)
    assert paginator.count == 35
    assert not paginator.estimated and not paginator.capped


def test_without_an_estimate_the_count_is_exact_or_capped(monkeypatch) -> None:
    # SQLite, or a PostgreSQL table never analyzed (reltuples -1): never a guess.
    add_records(1, 25)
    assert EstimatedCountPaginator(CommunityLeave.objects.order_by("-pk"), 10).count == 25
    monkeypatch.setattr(paging, "COUNT_CAP", 20)
    paginator = EstimatedCountPaginator(CommunityLeave.objects.filter(user_id__gt=0).order_by("-pk"), 10)
    assert paginator.count == 20 and paginator.capped


def test_filtered_count_stops_at_the_cap_and_pages_go_no_deeper(monkeypatch) -> None:
    monkeypatch.setattr(paging, "COUNT_CAP", 20)
    add_records(1, 45)
    queryset = CommunityLeave.objects.filter(user_id__lte=44).order_by("-pk")
    paginator = EstimatedCountPaginator(queryset, 10)
    assert paginator.count == 20
    assert paginator.capped and not paginator.estimated
    assert paginator.num_pages == 2
    assert [r.user_id for r in paginator.page(1)] == list(range(44, 34, -1))
    under = EstimatedCountPaginator(CommunityLeave.objects.filter(user_id__lte=15).order_by("-pk"), 10)
    assert (under.count, under.capped, under.num_pages) == (15, False, 2)


def test_capped_list_says_more_than(monkeypatch, superuser) -> None:
    monkeypatch.setattr(paging, "COUNT_CAP", 20)
    add_records(1, 30)
    html = logged_in(superuser).get(RECORDS, {"status": "left"}).content.decode()
    assert "more than 20" in html


@postgresql_only
def test_estimated_list_says_about(monkeypatch, superuser) -> None:
    monkeypatch.setattr(paging, "EXACT_BELOW", 10)
    add_records(1, 30)
    analyze(CommunityLeave)
    r = logged_in(superuser).get(RECORDS)
    assert r.status_code == 200
    assert "about 30" in r.content.decode()


# --- the console's counts -------------------------------------------------------------------


@postgresql_only
def test_console_counts_left_from_the_estimate_past_the_threshold(monkeypatch) -> None:
    add_records(1, 40)
    add_records(100, 7, MembershipStatus.ACTIVE)
    CommunityLeave.objects.create(user_id=500, value=b"\x07bad")
    analyze(CommunityLeave)
    monkeypatch.setattr("community.selectors.EXACT_BELOW", 10)
    counts = leave_record_counts()
    assert counts == (7, 40, 1, True)
    assert counts.left_now == 41


def test_console_counts_are_exact_on_small_tables() -> None:
    add_records(1, 4)
    add_records(100, 2, MembershipStatus.ACTIVE)
    assert leave_record_counts() == (2, 4, 0, False)


# --- the kind filter and the windows --------------------------------------------------------


@pytest.fixture
def signals(db) -> list[int]:
    sender = UserFactory(perms=["signals_app.add_signal"])
    return ingest(sender, sig(1, kind="view"), sig(2, kind="like"), sig(3, kind="view"), sig(4, kind="share"))


def test_signal_kinds_lists_each_stored_kind_once_in_order(signals) -> None:
    assert signal_kinds() == ["like", "share", "view"]


def test_kind_filter_offers_the_stored_kinds_and_filters(superuser, signals) -> None:
    client = logged_in(superuser)
    r = client.get(SIGNALS)
    kind_filter = next(spec for spec in r.context["cl"].filter_specs if getattr(spec, "parameter_name", "") == "kind")
    assert [value for value, _ in kind_filter.lookup_choices] == ["like", "share", "view"]
    assert shown_ids(client.get(SIGNALS, {"kind": "view"})) == [signals[0], signals[2]]
    assert shown_ids(client.get(SIGNALS, {"kind": "nope"})) == []


def test_received_window_filter(superuser, signals) -> None:
    Signal.objects.filter(pk=signals[0]).update(received_at=timezone.now() - timedelta(hours=3))
    Signal.objects.filter(pk=signals[1]).update(received_at=timezone.now() - timedelta(days=3))
    client = logged_in(superuser)
    assert shown_ids(client.get(SIGNALS, {"received": "1h"})) == signals[2:]
    assert shown_ids(client.get(SIGNALS, {"received": "24h"})) == [signals[0], *signals[2:]]
    assert shown_ids(client.get(SIGNALS, {"received": "7d"})) == signals
    assert shown_ids(client.get(SIGNALS)) == signals


def test_history_changed_window_filter(superuser) -> None:
    old = leave_community_layer(user_id=1).version
    new = rejoin_community_layer(user_id=1).version
    LeaveHistory.objects.filter(version=old).update(at=timezone.now() - timedelta(days=2))
    client = logged_in(superuser)
    assert shown_ids(client.get(HISTORY, {"changed": "24h"})) == [new]
    assert shown_ids(client.get(HISTORY, {"changed": "7d"})) == [old, new]


@pytest.mark.parametrize("url", [SIGNALS, HISTORY, RECORDS])
def test_big_lists_have_no_date_hierarchy_and_no_facets(superuser, url) -> None:
    r = logged_in(superuser).get(url, {"_facets": "True"})
    assert r.status_code == 200
    assert r.context["cl"].date_hierarchy is None
    assert not r.context["cl"].add_facets


def test_action_checkbox_is_the_stock_markup() -> None:
    from django.contrib import admin

    add_records(7, 1)
    record = CommunityLeave.objects.get(pk=7)
    model_admin = admin.site._registry[CommunityLeave]
    assert model_admin.action_checkbox(record) == admin.ModelAdmin.action_checkbox(model_admin, record)
