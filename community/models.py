from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from .cache import LeaveCache, LeaveGate, RecordStatus
from .membership import MAX_USER_ID, CommunityMembership, deserialize_membership


class CommunityLeaveManager(models.Manager["CommunityLeave"]):
    """Holds the process-local leave cache (shared by every copy Django makes of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = LeaveCache()

    def gate(self, using: str | None = None) -> LeaveGate:
        """Sync the fence and return the gate: call once per batch, then look up freely."""
        return self.cache.sync(using or self.db)


class CommunityLeave(models.Model):
    """One row per user who ever left: the packed 9-byte record of the design note."""

    user_id = models.BigIntegerField(primary_key=True)
    value = models.BinaryField(max_length=9, editable=False)

    objects = CommunityLeaveManager()

    class Meta:
        verbose_name = "community leave record"
        # Erasing takes back a user's past contributions and deletes their signals: operators
        # need this permission of its own (a user may always erase themselves).
        permissions = [("erase_communityleave", "Can erase a user's signals and contributions")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user_id__gte=0, user_id__lte=MAX_USER_ID),
                name="community_leave_user_id_range",
            )
        ]

    def __str__(self) -> str:
        return f"leave record of user {self.user_id}"

    @property
    def membership(self) -> CommunityMembership | None:
        """The decoded record, or None where the stored value is corrupt."""
        return deserialize_membership(self.user_id, self.value)


class LeaveClock(models.Model):
    """The fence: a single row whose counters order every change to the leave records.

    Each leave/rejoin transaction locks this row first and bumps ``version`` once per
    changed record, so versions are handed out and committed in the same order.
    ``generation`` is bumped by rebuild_leave_status to make every process re-warm.
    ``epoch`` is drawn afresh whenever the row is created (migrate, flush, a re-created row),
    so a process never mistakes a new clock for the one it cached; a restore that brings
    back an old row is caught by the fence's other checks (see ``community.cache``).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    version = models.BigIntegerField(default=0)
    generation = models.BigIntegerField(default=0)
    epoch = models.UUIDField(default=uuid.uuid4, editable=False)

    class Meta:
        constraints = [models.CheckConstraint(condition=models.Q(id=1), name="leave_clock_single_row")]

    def __str__(self) -> str:
        return f"leave clock v{self.version} g{self.generation}"


class ChangeAction(models.TextChoices):
    LEAVE = "leave", "leave"
    REJOIN = "rejoin", "rejoin"
    # A leave that also took back the past (signals_app.erasure): always written, even for a
    # user already left, so that every fence sees it; the row carries the receipt's counts.
    ERASE = "erase", "erase"


class ChangeSource(models.TextChoices):
    API = "api", "API"
    ADMIN = "admin", "admin"
    COMMAND = "command", "management command"


class LeaveHistory(models.Model):
    """Append-only audit of every change, keyed by the clock version: also the change feed."""

    version = models.BigIntegerField(primary_key=True)
    user_id = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=ChangeAction.choices)
    value = models.BinaryField(max_length=9)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The acting account's username at the time, kept when the account is later deleted.
    actor_label = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=16, choices=ChangeSource.choices)
    at = models.DateTimeField(default=timezone.now)
    # An erasure's receipt (null for other actions): signals deleted, aggregate rows changed.
    signals_removed = models.BigIntegerField(null=True, blank=True)
    aggregate_rows_changed = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name = "leave history entry"
        verbose_name_plural = "leave history"
        ordering = ["-version"]
        indexes = [
            models.Index(fields=["user_id", "-version"], name="leave_history_user"),
            models.Index(fields=["at"], name="leave_history_at"),  # the console's per-day counts
            # Warming the erased set and settling erasures read the erase rows only.
            models.Index(fields=["user_id", "version"], condition=models.Q(action="erase"), name="leave_history_erase"),
        ]

    def __str__(self) -> str:
        return f"v{self.version} user {self.user_id} {self.action}"

    @property
    def membership(self) -> CommunityMembership | None:
        return deserialize_membership(self.user_id, self.value)


slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_-]{0,63}$", "Use 1 to 64 of a-z, 0-9, - and _, starting with a letter or digit."
)


class MemberGroup(models.Model):
    """What communities and cohorts share: a slug, a name, members by user id."""

    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        abstract = True
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Community(MemberGroup):
    """Signals of its members are forwarded to it (community trending)."""

    class Meta(MemberGroup.Meta):
        verbose_name_plural = "communities"


class Cohort(MemberGroup):
    """Signals of its members are attributed to it."""


class CommunityMember(models.Model):
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="members")
    user_id = models.BigIntegerField()
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["community", "user_id"], name="community_member_unique"),
            models.CheckConstraint(condition=models.Q(user_id__gte=0), name="community_member_user_id_range"),
        ]
        # The pipeline loads memberships by user id, a batch at a time.
        indexes = [models.Index(fields=["user_id", "community"], name="community_member_by_user")]

    def __str__(self) -> str:
        return f"user {self.user_id} in {self.community_id}"


class CohortMember(models.Model):
    cohort = models.ForeignKey(Cohort, on_delete=models.CASCADE, related_name="members")
    user_id = models.BigIntegerField()
    joined_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cohort", "user_id"], name="cohort_member_unique"),
            models.CheckConstraint(condition=models.Q(user_id__gte=0), name="cohort_member_user_id_range"),
        ]
        indexes = [models.Index(fields=["user_id", "cohort"], name="cohort_member_by_user")]

    def __str__(self) -> str:
        return f"user {self.user_id} in {self.cohort_id}"


__all__ = [
    "ChangeAction",
    "ChangeSource",
    "Cohort",
    "CohortMember",
    "Community",
    "CommunityLeave",
    "CommunityMember",
    "LeaveClock",
    "LeaveHistory",
    "RecordStatus",
]
