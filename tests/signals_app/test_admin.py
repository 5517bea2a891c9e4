"""The Django admin of signals, aggregates, communities, cohorts and memberships (DESIGN.md sections 6, 7)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from community.models import Cohort, CohortMember, Community, CommunityMember
from community.services.groups import group_members_add
from community.services.layer import leave_community_layer
from signals_app.models import CohortAggregate, CommunityAggregate, Outcome, Signal
from signals_app.services.processing import signals_process
from tests.factories import UserFactory
from tests.helpers import ingest, join, logged_in, shown_ids, sig

pytestmark = pytest.mark.django_db

SIGNALS = reverse("admin:signals_app_signal_changelist")
SUMMARY_ROW = re.compile(r"<tr><th>(\w+)</th><td>(\d+)</td><td>(\d+)</td>\s*<td>(\d+)</td><td>(\d+)</td></tr>")


@pytest.fixture
def admin_client_(superuser) -> Client:
    return logged_in(superuser)


@pytest.fixture
def processed(sender, community, cohort) -> dict[Outcome, list[int]]:
    """Two attributed, three gated, one no-target and one pending signal."""
    join(1, community, cohort)
    leave_community_layer(user_id=2)
    ids = {
        Outcome.ATTRIBUTED: ingest(sender, sig(1), sig(1, item_id=2)),
        Outcome.GATED: ingest(sender, sig(2), sig(2), sig(2)),
        Outcome.NO_TARGET: ingest(sender, sig(3)),
    }
    signals_process(signal_ids=[i for group in ids.values() for i in group])
    ids[Outcome.PENDING] = ingest(sender, sig(1))
    return ids


def summary_table(html: str) -> dict[str, tuple[int, ...]]:
    start = html.index('id="outcome-summary"')
    table = html[start : html.index("</table>", start)]
    return {m[0]: tuple(map(int, m[1:])) for m in SUMMARY_ROW.findall(table)}


def test_signal_changelist_shows_counts_by_outcome_with_the_gated(admin_client_, processed) -> None:
    r = admin_client_.get(SIGNALS)
    assert r.status_code == 200
    # attributed, gated, no target, pending
    assert summary_table(r.content.decode()) == {"Hour": (2, 3, 1, 1), "Day": (2, 3, 1, 1)}


def test_signal_changelist_filters_by_outcome(admin_client_, processed) -> None:
    r = admin_client_.get(SIGNALS, {"outcome__exact": Outcome.GATED})
    assert r.status_code == 200
    assert shown_ids(r) == processed[Outcome.GATED]


def test_signal_changelist_searches_by_user_id(admin_client_, processed) -> None:
    assert shown_ids(admin_client_.get(SIGNALS, {"q": "2"})) == processed[Outcome.GATED]
    r = admin_client_.get(SIGNALS, {"q": "not a number"})
    assert r.status_code == 200 and shown_ids(r) == []


def test_signal_change_page_is_read_only(admin_client_, processed) -> None:
    signal_id = processed[Outcome.GATED][0]
    url = reverse("admin:signals_app_signal_change", args=[signal_id])
    assert admin_client_.get(url).status_code == 200
    r = admin_client_.post(url, {"outcome": Outcome.ATTRIBUTED, "weight": 9})
    assert r.status_code == 403
    assert Signal.objects.get(pk=signal_id).outcome == Outcome.GATED


@pytest.mark.parametrize("model", [Signal, CommunityAggregate, CohortAggregate])
def test_signals_and_aggregates_cannot_be_added_or_deleted(admin_client_, processed, model) -> None:
    meta = model._meta
    assert admin_client_.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_add")).status_code == 403
    obj = model.objects.first()
    delete = reverse(f"admin:{meta.app_label}_{meta.model_name}_delete", args=[obj.pk])
    assert admin_client_.post(delete, {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


@pytest.mark.parametrize("model", [CommunityAggregate, CohortAggregate])
def test_aggregate_changelists_list_the_rows(admin_client_, processed, model) -> None:
    meta = model._meta
    r = admin_client_.get(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
    assert r.status_code == 200
    assert shown_ids(r) == sorted(model.objects.values_list("pk", flat=True))
    assert len(shown_ids(r)) == 2


def test_a_staff_member_without_view_signal_cannot_see_signals(db) -> None:
    assert logged_in(UserFactory(is_staff=True)).get(SIGNALS).status_code == 403


@pytest.mark.parametrize("model", [Community, Cohort])
def test_group_admin_lists_and_searches_by_slug_and_name(admin_client_, model) -> None:
    python = model.objects.create(slug="python", name="Snakes")
    rust = model.objects.create(slug="rust", name="Crabs")
    url = reverse(f"admin:community_{model._meta.model_name}_changelist")
    assert shown_ids(admin_client_.get(url)) == sorted([python.pk, rust.pk])
    assert shown_ids(admin_client_.get(url, {"q": "pyth"})) == [python.pk]
    assert shown_ids(admin_client_.get(url, {"q": "crab"})) == [rust.pk]


@pytest.mark.parametrize(("member_model", "group_model"), [(CommunityMember, Community), (CohortMember, Cohort)])
def test_member_admin_searches_by_user_id(admin_client_, member_model, group_model) -> None:
    one = group_model.objects.create(slug="one", name="One")
    two = group_model.objects.create(slug="two", name="Two")
    group_members_add(group=one, user_ids=[101, 1010, 2])
    group_members_add(group=two, user_ids=[101])
    url = reverse(f"admin:community_{member_model._meta.model_name}_changelist")
    r = admin_client_.get(url, {"q": "101"})
    assert r.status_code == 200
    assert sorted(m.user_id for m in r.context["cl"].result_list) == [101, 101]
    for term in ("10", "abc", "-101", str(2**63)):
        r = admin_client_.get(url, {"q": term})
        assert r.status_code == 200 and shown_ids(r) == [], term


def test_signals_can_be_filtered_by_gated_reason_and_failed_ones_retried(
    admin_client_, processed, enqueued, django_capture_on_commit_callbacks
) -> None:
    r = admin_client_.get(SIGNALS, {"gated_reason__exact": "1"})
    assert r.status_code == 200
    assert {s.pk for s in r.context["cl"].result_list} == set(processed[Outcome.GATED])
    failed = processed[Outcome.NO_TARGET][0]
    Signal.objects.filter(pk=failed).update(outcome=Outcome.FAILED, error="ProgrammingError: boom")
    r = admin_client_.get(SIGNALS, {"outcome__exact": str(int(Outcome.FAILED))})
    assert [s.pk for s in r.context["cl"].result_list] == [failed]
    with django_capture_on_commit_callbacks(execute=True):
        r = admin_client_.post(SIGNALS, {"action": "retry_failed", "_selected_action": [failed]}, follow=True)
    assert "1 failed signal(s) put back to pending and enqueued." in r.content.decode()
    assert Signal.objects.get(pk=failed).outcome == Outcome.PENDING and enqueued == [[failed]]


def test_retrying_needs_the_change_permission(processed) -> None:
    viewer = UserFactory(is_staff=True, perms=["signals_app.view_signal"])
    r = logged_in(viewer).get(SIGNALS)
    assert r.status_code == 200 and "retry_failed" not in r.content.decode()
