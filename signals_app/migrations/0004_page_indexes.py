"""Indexes for the operators' pages on millions of signals (see Signal.Meta), built concurrently
on PostgreSQL so that ingest goes on meanwhile."""

from django.db import migrations, models

import signals_app.models
from tidalproject.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("signals_app", "0003_erasure"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="signal",
            index=models.Index(fields=["kind", "-id"], name="signal_by_kind"),
        ),
        AddIndexConcurrently(
            model_name="signal",
            index=models.Index(
                condition=models.Q(("gated_reason__isnull", False)),
                fields=["gated_reason", "-id"],
                name="signal_gated_by_reason",
            ),
        ),
        AddIndexConcurrently(
            model_name="signal",
            index=signals_app.models.BrinOnPostgres(
                autosummarize=True, fields=["received_at"], name="signal_received_brin"
            ),
        ),
    ]
