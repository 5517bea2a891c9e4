"""Indexes for the operators' pages on a million records and millions of history rows (see
the models), built concurrently on PostgreSQL."""

from django.db import migrations, models

import community.record_status
from tidalproject.migration_ops import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("community", "0007_erase_receipt"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="communityleave",
            index=models.Index(community.record_status.RecordStatus("value"), models.F("user_id"), name="leave_record_status"),
        ),
        AddIndexConcurrently(
            model_name="leavehistory",
            index=models.Index(fields=["at", "action"], name="leave_history_at_action"),
        ),
        # Replaced by leave_history_at_action, which answers the same reads and the per-day counts.
        migrations.RemoveIndex(model_name="leavehistory", name="leave_history_at"),
        AddIndexConcurrently(
            model_name="leavehistory",
            index=models.Index(fields=["action", "-version"], name="leave_history_action"),
        ),
        AddIndexConcurrently(
            model_name="leavehistory",
            index=models.Index(fields=["source", "-version"], name="leave_history_source"),
        ),
    ]
