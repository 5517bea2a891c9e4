from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.utils import timezone

from community.groups import GroupAggregate
from community.models import Cohort, Community


def hour_bucket(moment: datetime) -> datetime:
    """The UTC hour an aggregate row counts ``moment`` in (the same for any offset given)."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


class BrinOnPostgres(BrinIndex):
    """A BRIN index on PostgreSQL; a plain B-tree on the embedded SQLite default."""

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.vendor != "postgresql":
            return models.Index.create_sql(self, model, schema_editor, using=using, **kwargs)
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class Outcome(models.IntegerChoices):
    PENDING = 0, "pending"
    ATTRIBUTED = 1, "attributed"
    GATED = 2, "gated"
    NO_TARGET = 3, "no_target"
    # Processing failed for a reason that retrying will not cure (not a transient database
    # error): isolated from its batch, kept with the error, retried by retry_failed_signals.
    FAILED = 4, "failed"


class GatedReason(models.IntegerChoices):
    """Why a signal was gated: the fence positions and the history say which."""

    LEFT_AT_RECEIPT = 1, "left_at_receipt"
    LEFT_WHILE_QUEUED = 2, "left_while_queued"
    LEFT_AT_PROCESSING = 3, "left_at_processing"
    CORRUPT_RECORD = 4, "corrupt_record"


# What a signal says and when it came, then what became of it: the columns the admin's list
# and the API's signals show first, in this order.
SIGNAL_FIELDS = ("id", "user_id", "item_id", "kind", "weight", "occurred_at", "received_at", "outcome")


class Signal(models.Model):
    """One signal of a user on an item, stored as pending and processed exactly once."""

    id = models.BigAutoField(primary_key=True)
    sender = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    user_id = models.BigIntegerField()
    item_id = models.BigIntegerField()
    kind = models.CharField(max_length=32)
    weight = models.FloatField(default=1.0)
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)
    # NULL, not "", for "no key": the unique constraint applies to keyed signals only.
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    outcome = models.PositiveSmallIntegerField(choices=Outcome.choices, default=Outcome.PENDING)
    processed_at = models.DateTimeField(null=True, blank=True)
    # The evidence: the leave clock version at which the gate was checked on receipt and at
    # processing. Attributed means active at every version from the one to the other.
    fence_at_receipt = models.BigIntegerField(null=True, blank=True)
    fence_at_processing = models.BigIntegerField(null=True, blank=True)
    gated_reason = models.PositiveSmallIntegerField(choices=GatedReason.choices, null=True, blank=True)
    # Where an attributed signal was credited (ids), so that the aggregates can be checked
    # against their signals, and an erasure can take a signal back from exactly those rows.
    credited_communities = models.JSONField(null=True, blank=True)
    credited_cohorts = models.JSONField(null=True, blank=True)
    # When a processing task was last sent for it: the sweep does not send another while
    # that one may still be queued.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["sender", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="signal_idempotency_key_per_sender",
            ),
        ]
        indexes = [
            models.Index(fields=["user_id", "-id"], name="signal_by_user"),
            # The sweep looks for old pending signals only: a small partial index.
            models.Index(fields=["received_at"], condition=models.Q(outcome=0), name="signal_pending_by_age"),
            models.Index(fields=["outcome", "processed_at"], name="signal_outcome_time"),
            models.Index(fields=["id"], condition=models.Q(outcome=4), name="signal_failed"),
            # An erasure recomputes last_at of an aggregate row from the remaining attributed
            # signals of its (item, kind, hour): without this, one scan of the table per row.
            models.Index(
                fields=["item_id", "kind", "occurred_at"],
                condition=models.Q(outcome=1),
                name="signal_attributed_by_item",
            ),
            # The operators' pages on millions of signals (each index costs every insert a little):
            # the kind filter, newest first, and its list of kinds (a loose index scan); without it
            # a rare kind reads the whole table from the newest end.
            models.Index(fields=["kind", "-id"], name="signal_by_kind"),
            # The gated-reason filter; gated signals only (a minority), nothing for the others.
            models.Index(
                fields=["gated_reason", "-id"],
                condition=models.Q(gated_reason__isnull=False),
                name="signal_gated_by_reason",
            ),
            # "Received in the last …": a BRIN index, a few pages for millions of rows, since ids
            # and received_at grow together; it costs the ingest next to nothing.
            BrinOnPostgres(fields=["received_at"], name="signal_received_brin", autosummarize=True),
        ]

    def __str__(self) -> str:
        return f"signal {self.id} of user {self.user_id}"


class CommunityAggregate(GroupAggregate):
    """What was forwarded to a community: drives its trending list."""

    group_field = "community"
    credited_field = "credited_communities"
    # No index of its own: the unique (community, hour, item, kind) key starts with it. Every
    # index of this table is written by every batch's upsert: one less is measured (BENCHMARKS.md).
    # No foreign key constraint in the database either (db_constraint=False): its check of every
    # new row at commit cost the pipeline about a tenth of its time. The guarantee stays: a batch
    # locks the groups it credits (signals_app.sql.credit), a deletion locks the group first
    # (community.groups), and Django still deletes a group's aggregates with it (CASCADE).
    community = models.ForeignKey(
        Community, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["community", "hour", "item_id", "kind"], name="community_aggregate_key")
        ]


class CohortAggregate(GroupAggregate):
    """What was attributed to a cohort."""

    group_field = "cohort"
    credited_field = "credited_cohorts"
    # As CommunityAggregate.community: no index of its own, no constraint in the database.
    cohort = models.ForeignKey(Cohort, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cohort", "hour", "item_id", "kind"], name="cohort_aggregate_key")
        ]


class ErasureJob(models.Model):
    """A bulk erasure: users erased one by one by a Celery task, each in its own transaction,
    with a result row per user (so a task delivered again resumes where the last one stopped)."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        RUNNING = "running", "running"
        DONE = "done", "done"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_label = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=16)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    total = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When a task was last sent for it: the sweep sends another for an unfinished job whose
    # task has not been heard of for a while (a worker killed, a broker that lost it).
    kicked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["kicked_at"], condition=~models.Q(state="done"), name="erasure_job_unfinished")]

    def __str__(self) -> str:
        return f"erasure job {self.pk} ({self.total} users, {self.state})"


class ErasureJobUser(models.Model):
    """One user of a bulk erasure and, once erased, the receipt's figures."""

    class State(models.TextChoices):
        PENDING = "pending", "pending"
        DONE = "done", "done"
        FAILED = "failed", "failed"

    job = models.ForeignKey(ErasureJob, on_delete=models.CASCADE, related_name="users")
    position = models.PositiveIntegerField()
    user_id = models.BigIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    version = models.BigIntegerField(null=True, blank=True)
    signals_removed = models.BigIntegerField(null=True, blank=True)
    aggregate_rows_changed = models.BigIntegerField(null=True, blank=True)
    already_erased = models.BooleanField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "position"]
        constraints = [
            models.UniqueConstraint(fields=["job", "position"], name="erasure_job_user_position"),
            models.UniqueConstraint(fields=["job", "user_id"], name="erasure_job_user_once"),
        ]

    def __str__(self) -> str:
        return f"user {self.user_id} of erasure job {self.job_id}: {self.state}"
