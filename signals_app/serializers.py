"""Shapes of the signal API for the OpenAPI schema and the answers.

Incoming batches are validated by ``validation.parse_signal_batch`` (fast, one pass);
``SignalBatchSerializer`` documents the same rules for the schema.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from community.display import status_payload
from community.fields import UserIdField

from .erasure import ErasureReceipt
from .models import SIGNAL_FIELDS, ErasureJob, ErasureJobUser, GatedReason, Outcome, Signal
from .validation import KIND_RULE, MAX_ABS_WEIGHT, MAX_BATCH, MAX_KEY_LENGTH


class SignalInSerializer(serializers.Serializer[Any]):
    user_id = UserIdField()
    item_id = UserIdField(help_text="The item's id, 0 to 2**63-1.")
    kind = serializers.RegexField(f"^{KIND_RULE}$", max_length=32, help_text=KIND_RULE)
    weight = serializers.FloatField(
        required=False, default=1.0, min_value=-MAX_ABS_WEIGHT, max_value=MAX_ABS_WEIGHT, help_text="Default 1."
    )
    occurred_at = serializers.DateTimeField(
        required=False, help_text="RFC 3339 with an offset; default now; not in the future beyond the clock skew."
    )
    idempotency_key = serializers.CharField(
        required=False, min_length=1, max_length=MAX_KEY_LENGTH, help_text="Unique per sending account."
    )


class SignalBatchSerializer(serializers.Serializer[Any]):
    signals = SignalInSerializer(many=True, min_length=1, max_length=MAX_BATCH)  # type: ignore[call-arg]


class IngestResultSerializer(serializers.Serializer[Any]):
    accepted = serializers.IntegerField(help_text="Signals stored, to be processed.")
    duplicates = serializers.IntegerField(help_text="Signals whose idempotency key was used before.")
    suppressed = serializers.IntegerField(
        help_text="Signals of users erased and still left: not stored at all (a rejoin ends that)."
    )


class ErasureReceiptSerializer(serializers.Serializer[ErasureReceipt]):
    """An erasure's receipt, as written on its ``erase`` history row."""

    user_id = serializers.IntegerField()
    action = serializers.CharField(help_text='Always "erase".')
    version = serializers.IntegerField(help_text="The leave clock version of the erase history row.")
    status = serializers.ChoiceField(choices=["active", "left"])
    left_at = serializers.CharField(allow_null=True, help_text="RFC 3339, nanosecond precision, UTC")
    left_at_ns = serializers.IntegerField(allow_null=True)
    corrupt = serializers.BooleanField()
    signals_removed = serializers.IntegerField(help_text="The user's stored signals deleted.")
    aggregate_rows_changed = serializers.IntegerField(
        help_text="Cohort and community aggregate rows decremented or deleted."
    )
    already_erased = serializers.BooleanField(
        help_text="True: the user was already erased and still left, nothing was left to take back, nothing"
        " was written; the receipt is that of the earlier erasure."
    )
    actor = serializers.CharField(allow_null=True)
    source = serializers.CharField()  # type: ignore[assignment]  # a field named like Field.source
    at = serializers.DateTimeField()

    def to_representation(self, instance: ErasureReceipt) -> dict[str, Any]:
        return {
            **status_payload(instance.membership),
            "action": "erase",
            "version": instance.version,
            "signals_removed": instance.signals_removed,
            "aggregate_rows_changed": instance.aggregate_rows_changed,
            "already_erased": instance.already_erased,
            "actor": instance.actor or None,
            "source": instance.source,
            "at": serializers.DateTimeField().to_representation(instance.at),
        }


class SignalOutSerializer(serializers.ModelSerializer[Signal]):
    outcome = serializers.ChoiceField(choices=Outcome.labels, source="get_outcome_display")
    gated_reason = serializers.ChoiceField(
        choices=GatedReason.labels,
        allow_null=True,
        source="get_gated_reason_display",
        help_text="Why a gated signal was gated; null otherwise.",
    )
    fence_at_receipt = serializers.IntegerField(
        allow_null=True, help_text="Leave clock version at which the gate was checked on receipt."
    )
    fence_at_processing = serializers.IntegerField(
        allow_null=True, help_text="Leave clock version at which the gate was checked at processing."
    )

    class Meta:
        model = Signal
        fields = [
            *SIGNAL_FIELDS,
            "processed_at",
            "fence_at_receipt",
            "fence_at_processing",
            "gated_reason",
        ]


class PaginatedSignalsSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = SignalOutSerializer(many=True)


class BulkErasureSerializer(serializers.Serializer[Any]):
    user_ids = serializers.ListField(
        child=UserIdField(),
        min_length=1,
        max_length=settings.ERASURE_JOB_MAX_USERS,
        allow_empty=False,
        help_text="1 to ERASURE_JOB_MAX_USERS (10,000) user ids; repeats are erased once.",
    )


class ErasureJobSerializer(serializers.ModelSerializer[ErasureJob]):
    """A bulk erasure's progress: users done, failed, still pending."""

    done = serializers.IntegerField(read_only=True)
    failed = serializers.IntegerField(read_only=True)
    pending = serializers.IntegerField(read_only=True)
    created_by = serializers.CharField(source="created_by_label", read_only=True)

    class Meta:
        model = ErasureJob
        fields = [
            "id",
            "state",
            "total",
            "done",
            "failed",
            "pending",
            "created_by",
            "source",
            "created_at",
            "started_at",
            "finished_at",
        ]


class ErasureJobUserSerializer(serializers.ModelSerializer[ErasureJobUser]):
    """One user's result: the receipt's figures once erased, the error if it failed."""

    class Meta:
        model = ErasureJobUser
        fields = [
            "position",
            "user_id",
            "state",
            "version",
            "signals_removed",
            "aggregate_rows_changed",
            "already_erased",
            "error",
            "finished_at",
        ]
