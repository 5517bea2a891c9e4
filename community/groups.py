"""The one shape communities and cohorts share: the group, its members, its hourly aggregates.

Each group class declares the models paired with it (``Community.members_model``,
``Community.aggregate_model``), so code asks the class for its twin instead of switching on
the kind. The pairing is by label, read from the app registry on use: the aggregates live in
``signals_app``, a layer above this one, which this module never imports.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar, cast, overload

from django.apps import apps
from django.core.validators import RegexValidator
from django.db import models, transaction
from django.utils import timezone

_M = TypeVar("_M", bound=models.Model)


class Paired(Generic[_M]):
    """A model paired with a group class, named by its label ("app_label.ModelName")."""

    def __init__(self, label: str) -> None:
        self.label = label

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> type[_M]: ...
    @overload
    def __get__(self, instance: object, owner: type[Any]) -> type[_M]: ...
    def __get__(self, instance: object, owner: type[Any]) -> type[_M]:
        return cast("type[_M]", apps.get_model(self.label))


slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_-]{0,63}$", "Use 1 to 64 of a-z, 0-9, - and _, starting with a letter or digit."
)


class GroupQuerySet(models.QuerySet[Any]):
    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete the groups, their members and their aggregates, the groups' rows locked first.

        The aggregate tables have no foreign key constraint to their group (signals_app.models):
        a batch locks each group it credits FOR KEY SHARE instead. FOR UPDATE here, in id order
        as the batches lock them, waits for every batch crediting these groups to commit, so
        the rows they wrote are deleted with the others; a batch that comes after finds the
        groups gone and credits nothing to them. No aggregate row outlives its group.
        """
        with transaction.atomic(using=self.db):
            self.lock_for_deletion()
            return super().delete()

    def lock_for_deletion(self) -> None:
        """Hold these groups' rows FOR UPDATE, in id order as the batches lock them, until the
        transaction ends (call it inside one)."""
        list(self.order_by("pk").select_for_update().values_list("pk", flat=True))


class MemberGroup(models.Model):
    """What communities and cohorts share: a slug, a name, members by user id."""

    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    objects = GroupQuerySet.as_manager()

    # Declared by each group class: its members (user <-> group) and its hourly aggregates.
    members_model: ClassVar[Paired[GroupMember]]
    aggregate_model: ClassVar[Paired[GroupAggregate]]

    class Meta:
        abstract = True
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict[str, int]]:
        """As ``GroupQuerySet.delete``: the group's row locked first."""
        with transaction.atomic(using=using):
            type(self).objects.using(using).filter(pk=self.pk).lock_for_deletion()
            return super().delete(using=using, keep_parents=keep_parents)


class _ByGroup(models.Model):
    """A row that belongs to one group through the foreign key named ``group_field``."""

    group_field: ClassVar[str]

    class Meta:
        abstract = True

    @classmethod
    def group_key(cls) -> models.ForeignKey[Any, Any]:
        return cast("models.ForeignKey[Any, Any]", cls._meta.get_field(cls.group_field))

    @classmethod
    def group_model(cls) -> type[MemberGroup]:
        return cast("type[MemberGroup]", cls.group_key().related_model)

    @classmethod
    def group_column(cls) -> str:
        """The foreign key's column (``community_id``): for set-based SQL and value lists."""
        return cls.group_key().column

    def group_id(self) -> int:
        return cast("int", getattr(self, self.group_key().attname))


class GroupMember(_ByGroup):
    """A user's membership of a group (the concrete model adds the key to its group)."""

    user_id = models.BigIntegerField()
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"user {self.user_id} in {self.group_id()}"


def member_meta(group: str) -> Any:
    """A member model's ``Meta``: one row per (group, user), a user id in range, and an index by
    user (the pipeline loads memberships by user id, a batch at a time). No index on the group
    key alone: the unique (group, user_id) key starts with it and serves every look-up by group."""

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=[group, "user_id"], name=f"{group}_member_unique"),
            models.CheckConstraint(condition=models.Q(user_id__gte=0), name=f"{group}_member_user_id_range"),
        ]
        indexes = [models.Index(fields=["user_id", group], name=f"{group}_member_by_user")]

    return Meta


class GroupAggregate(_ByGroup):
    """Per group, item, kind and hour: how many signals, their weight sum, the last time."""

    # The signal's JSON list of the groups of this kind it was credited to.
    credited_field: ClassVar[str]

    item_id = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    hour = models.DateTimeField()
    count = models.BigIntegerField(default=0)
    weight_sum = models.FloatField(default=0.0)
    last_at = models.DateTimeField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.group_id()} item {self.item_id} {self.kind} @ {self.hour:%Y-%m-%d %H}h"
