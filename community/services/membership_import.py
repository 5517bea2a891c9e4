"""Importing memberships from ``kind,slug,user_id`` lines (the import_memberships command)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction

from ..ids import parse_user_id
from ..models import Cohort, Community, slug_validator
from .groups import group_members_add

# The group kinds a membership import names.
GROUP_KINDS: dict[str, type[Community] | type[Cohort]] = {"community": Community, "cohort": Cohort}


class MembershipImportError(ValueError):
    """A line of a membership import is wrong; nothing was imported."""


@dataclass(frozen=True)
class ImportReport:
    added: int
    already: int
    created: int


def memberships_import(*, lines: Iterable[str], create_groups: bool = False) -> ImportReport:
    """Import ``kind,slug,user_id`` lines (kind: community or cohort), all in one transaction."""
    wanted: dict[tuple[str, str], set[int]] = {}
    for number, row in enumerate(csv.reader(lines), start=1):
        if not row or (number == 1 and row[:1] == ["kind"]):
            continue
        if len(row) != 3:
            raise MembershipImportError(f"line {number}: expected 3 fields kind,slug,user_id, got {len(row)}")
        kind, slug, raw_id = (field.strip() for field in row)
        if kind not in GROUP_KINDS:
            raise MembershipImportError(f"line {number}: kind must be community or cohort, got {kind!r}")
        try:
            user_id = parse_user_id(raw_id)
        except ValueError as exc:
            raise MembershipImportError(f"line {number}: user_id {raw_id!r}: {exc}") from None
        wanted.setdefault((kind, slug), set()).add(user_id)
    added = already = created = 0
    with transaction.atomic():
        for (kind, slug), user_ids in sorted(wanted.items()):
            model = GROUP_KINDS[kind]
            group = model.objects.filter(slug=slug).first()
            if group is None:
                if not create_groups:
                    raise MembershipImportError(f"no {kind} with slug {slug!r} (use --create-groups)")
                try:
                    slug_validator(slug)
                except DjangoValidationError as exc:
                    raise MembershipImportError(f"{kind} slug {slug!r}: {' '.join(exc.messages)}") from None
                group = model.objects.create(slug=slug, name=slug)
                created += 1
            change = group_members_add(group=group, user_ids=sorted(user_ids))
            added += change.changed
            already += change.unchanged
    return ImportReport(added=added, already=already, created=created)
