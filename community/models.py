from __future__ import annotations

import base64
import secrets
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from .groups import GroupAggregate, GroupMember, MemberGroup, Paired, member_meta, slug_validator
from .membership import MAX_USER_ID, CommunityMembership, deserialize_membership
from .record_status import RecordStatus


class CommunityLeave(models.Model):
    """One row per user who ever left: the packed 9-byte record of the design note."""

    user_id = models.BigIntegerField(primary_key=True)
    value = models.BinaryField(max_length=9, editable=False)

    class Meta:
        verbose_name = "community leave record"
        # Erasing takes back a user's past contributions and deletes their signals: operators
        # need this permission of its own (a user may always erase themselves).
        permissions = [("erase_communityleave", "Can erase a user's signals and contributions")]
        indexes = [
            # The admin's status filter and the console's counts by status, on a million records:
            # the codec's rule evaluated in SQL (RecordStatus), then the list's order. Records
            # change only on a leave or a rejoin, so the index costs the signal pipeline nothing.
            models.Index(RecordStatus("value"), models.F("user_id"), name="leave_record_status"),
        ]
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


# The longest reason a leave, rejoin or erasure may carry.
MAX_REASON_LENGTH = 500


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
    # Why, in the operator's or the user's words (optional); shown in the admin, feed and webhooks.
    reason = models.CharField(max_length=MAX_REASON_LENGTH, blank=True, default="")
    # An erasure's receipt (null for other actions): signals deleted, aggregate rows changed.
    signals_removed = models.BigIntegerField(null=True, blank=True)
    aggregate_rows_changed = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name = "leave history entry"
        verbose_name_plural = "leave history"
        ordering = ["-version"]
        indexes = [
            models.Index(fields=["user_id", "-version"], name="leave_history_user"),
            # Warming the erased set and settling erasures read the erase rows only.
            models.Index(fields=["user_id", "version"], condition=models.Q(action="erase"), name="leave_history_erase"),
            # The console's per-day counts (an index-only scan: the action is in it) and the
            # admin's "changed in the last …".
            models.Index(fields=["at", "action"], name="leave_history_at_action"),
            # The admin's action and source filters, newest first: a rare value is otherwise found
            # by reading the history from the newest end. Changes are rare next to signals, so
            # these cost little; each is written once a change.
            models.Index(fields=["action", "-version"], name="leave_history_action"),
            models.Index(fields=["source", "-version"], name="leave_history_source"),
        ]

    def __str__(self) -> str:
        return f"v{self.version} user {self.user_id} {self.action}"

    @property
    def membership(self) -> CommunityMembership | None:
        return deserialize_membership(self.user_id, self.value)


class Community(MemberGroup):
    """Signals of its members are forwarded to it (community trending)."""

    members_model = Paired["CommunityMember"]("community.CommunityMember")
    aggregate_model = Paired[GroupAggregate]("signals_app.CommunityAggregate")

    class Meta(MemberGroup.Meta):
        verbose_name_plural = "communities"


class Cohort(MemberGroup):
    """Signals of its members are attributed to it."""

    members_model = Paired["CohortMember"]("community.CohortMember")
    aggregate_model = Paired[GroupAggregate]("signals_app.CohortAggregate")


class CommunityMember(GroupMember):
    group_field = "community"
    community = models.ForeignKey(Community, on_delete=models.CASCADE, related_name="members", db_index=False)
    Meta = member_meta("community")


class CohortMember(GroupMember):
    group_field = "cohort"
    cohort = models.ForeignKey(Cohort, on_delete=models.CASCADE, related_name="members", db_index=False)
    Meta = member_meta("cohort")


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


# What delivery writes on a subscription: shown by the API and the admin, never edited.
WEBHOOK_DELIVERY_STATE = (
    "consecutive_failures",
    "failing_since",
    "next_attempt_at",
    "last_attempt_at",
    "last_success_at",
    "last_status_code",
    "last_error",
)

# One delivery attempt: what it carried and how it ended (the delivery log's columns).
WEBHOOK_ATTEMPT_FIELDS = ("first_version", "last_version", "changes", "attempt", "ok", "status_code", "error")


class WebhookSubscription(models.Model):
    """A downstream system that receives every change, in version order, signed.

    ``acked_version`` is its cursor: every change up to it was acknowledged with a 2xx (or is
    of an action it does not want). ``lease_*`` keeps two workers from delivering to it at once.
    """

    name = models.CharField(max_length=100)
    url = models.CharField(max_length=2000, help_text="http:// or https://; checked against SSRF at send time.")
    secret = models.CharField(max_length=200, default=new_webhook_secret, help_text="Standard Webhooks secret")
    actions = models.JSONField(default=list, blank=True, help_text="Actions wanted; empty means every action.")
    is_active = models.BooleanField(default=True, help_text="Off: paused, nothing is sent.")
    paused_reason = models.CharField(max_length=200, blank=True)
    acked_version = models.BigIntegerField(default=0)
    consecutive_failures = models.PositiveIntegerField(default=0)
    failing_since = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)
    lease_token = models.CharField(max_length=32, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.url})"

    def wants(self, action: str) -> bool:
        return not self.actions or action in self.actions


class WebhookDelivery(models.Model):
    """One HTTP attempt to deliver a batch of changes to a subscriber (the delivery log)."""

    subscription = models.ForeignKey(WebhookSubscription, on_delete=models.CASCADE, related_name="deliveries")
    first_version = models.BigIntegerField()
    last_version = models.BigIntegerField()
    changes = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField(help_text="1 for a first attempt, then counts consecutive failures.")
    ok = models.BooleanField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()

    class Meta:
        verbose_name_plural = "webhook deliveries"
        ordering = ["-pk"]
        indexes = [
            models.Index(fields=["subscription", "-id"], name="webhook_delivery_sub"),
            models.Index(fields=["started_at"], name="webhook_delivery_started"),
        ]

    def __str__(self) -> str:
        return f"v{self.first_version}-{self.last_version} to {self.subscription_id}: {self.status_code or self.error}"


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
    "MemberGroup",
    "WebhookDelivery",
    "WebhookSubscription",
    "slug_validator",
]
