from django.db import migrations, models


class Migration(migrations.Migration):
    """Erasure: the ``erase`` action with its receipt counts, the erase permission, and an
    index of the erase rows (warming the erased set and settling erasures read only those)."""

    dependencies = [("community", "0006_history_reason_webhooks")]

    operations = [
        migrations.AlterModelOptions(
            name="communityleave",
            options={
                "permissions": [("erase_communityleave", "Can erase a user's signals and contributions")],
                "verbose_name": "community leave record",
            },
        ),
        migrations.AlterField(
            model_name="leavehistory",
            name="action",
            field=models.CharField(
                choices=[("leave", "leave"), ("rejoin", "rejoin"), ("erase", "erase")], max_length=16
            ),
        ),
        migrations.AddField(
            model_name="leavehistory",
            name="signals_removed",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="leavehistory",
            name="aggregate_rows_changed",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="leavehistory",
            index=models.Index(
                condition=models.Q(action="erase"), fields=["user_id", "version"], name="leave_history_erase"
            ),
        ),
    ]
