"""Communities and cohorts share one shape: each group class names its members and its
aggregates, and the string wiring of that pairing holds (a label that names a missing model,
or a model keyed to the other group class, fails here rather than in the pipeline)."""

from __future__ import annotations

import pytest

from community.groups import GroupAggregate, GroupMember, MemberGroup
from community.models import Cohort, CohortMember, Community, CommunityMember
from signals_app.models import CohortAggregate, CommunityAggregate, Signal

GROUP_CLASSES = [Community, Cohort]


def test_each_group_class_names_its_own_twins() -> None:
    assert Community.members_model is CommunityMember
    assert Cohort.members_model is CohortMember
    assert Community.aggregate_model is CommunityAggregate
    assert Cohort.aggregate_model is CohortAggregate
    # Asked of an instance, the answer is its class's.
    assert Cohort(slug="x").members_model is CohortMember


@pytest.mark.parametrize("group_class", GROUP_CLASSES)
def test_the_twins_are_keyed_to_their_group_class(group_class: type[MemberGroup]) -> None:
    members, aggregates = group_class.members_model, group_class.aggregate_model
    assert issubclass(members, GroupMember)
    assert issubclass(aggregates, GroupAggregate)
    for model in (members, aggregates):
        assert not model._meta.abstract
        assert model.group_key().related_model is group_class
        assert model.group_column() == model.group_key().column
    # The signal's list of the groups it was credited to, one per kind, never shared.
    assert Signal._meta.get_field(aggregates.credited_field).get_internal_type() == "JSONField"
    assert Community.aggregate_model.credited_field != Cohort.aggregate_model.credited_field


@pytest.mark.django_db
@pytest.mark.parametrize("group_class", GROUP_CLASSES)
def test_a_twin_row_names_its_group(group_class: type[MemberGroup]) -> None:
    group = group_class._default_manager.create(slug="g", name="G")
    members = group_class.members_model
    member = members._default_manager.create(**{members.group_field: group}, user_id=7)
    assert member.group_id() == group.pk
    assert str(member) == f"user 7 in {group.pk}"
