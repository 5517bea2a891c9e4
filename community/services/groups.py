"""Communities and cohorts: creating one, adding and removing its members."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from ..models import Cohort, Community


class SlugTaken(Exception):
    """Another community or cohort has this slug."""


def group_create(*, model: type[Community] | type[Cohort], slug: str, name: str) -> Community | Cohort:
    try:
        with transaction.atomic():
            return model.objects.create(slug=slug, name=name)
    except IntegrityError:
        raise SlugTaken(slug) from None


@dataclass(frozen=True)
class MembershipChange:
    changed: int
    unchanged: int


def group_members_add(*, group: Community | Cohort, user_ids: Iterable[int]) -> MembershipChange:
    """Add users to a community or cohort; ``unchanged`` counts those already in it."""
    ids = list(dict.fromkeys(user_ids))
    model = type(group).members_model
    field = model.group_field
    with transaction.atomic():
        # Locking the group serialises membership changes of one group, so the counts are exact.
        type(group).objects.select_for_update().get(pk=group.pk)
        existing = set(model.objects.filter(**{field: group}, user_id__in=ids).values_list("user_id", flat=True))
        new = [model(**{field: group}, user_id=u) for u in ids if u not in existing]
        model.objects.bulk_create(new, batch_size=1000)  # type: ignore[arg-type]
    return MembershipChange(changed=len(new), unchanged=len(existing))


def group_members_remove(*, group: Community | Cohort, user_ids: Iterable[int]) -> MembershipChange:
    """Remove users from a community or cohort; ``unchanged`` counts those not in it."""
    ids = list(dict.fromkeys(user_ids))
    model = type(group).members_model
    field = model.group_field
    with transaction.atomic():
        removed, _ = model.objects.filter(**{field: group}, user_id__in=ids).delete()
    return MembershipChange(changed=removed, unchanged=len(ids) - removed)
