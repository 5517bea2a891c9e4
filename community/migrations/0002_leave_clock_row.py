from django.db import migrations


def create_clock(apps, schema_editor):
    apps.get_model("community", "LeaveClock").objects.using(schema_editor.connection.alias).get_or_create(pk=1)


class Migration(migrations.Migration):
    """The fence's single clock row must exist before any leave or gate sync."""

    dependencies = [("community", "0001_initial")]

    operations = [migrations.RunPython(create_clock, migrations.RunPython.noop)]
