import uuid

from django.db import migrations, models


def draw_epoch(apps, schema_editor):
    clock = apps.get_model("community", "LeaveClock")
    clock.objects.using(schema_editor.connection.alias).update(epoch=uuid.uuid4())


class Migration(migrations.Migration):
    """An epoch on the clock row: drawn anew whenever the row is created, read by every fence."""

    dependencies = [("community", "0004_leave_history_at")]

    operations = [
        migrations.AddField(
            model_name="leaveclock",
            name="epoch",
            field=models.UUIDField(default=uuid.uuid4, editable=False),
        ),
        migrations.RunPython(draw_epoch, migrations.RunPython.noop),
    ]
