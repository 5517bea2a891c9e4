"""Tokens of DRF's authtoken (stored as sent) become hashed, expiring knox tokens.

Clients keep their token: knox finds a token by its first 15 characters and checks the
SHA-512 of the whole, so an old 40-character key authenticates as before until it expires
(SERVICE_TOKEN_TTL_DAYS after this migration) or is rotated. The plaintext rows are deleted.
On a database that never had authtoken, this does nothing.
"""

from datetime import timedelta

from django.conf import settings
from django.db import migrations
from django.utils import timezone
from knox.crypto import hash_token
from knox.settings import CONSTANTS


def hash_legacy_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    AuthToken = apps.get_model("knox", "AuthToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id FROM authtoken_token")
        rows = cursor.fetchall()
        expiry = timezone.now() + timedelta(days=settings.SERVICE_TOKEN_TTL_DAYS)
        AuthToken.objects.bulk_create(
            [
                AuthToken(digest=hash_token(key), token_key=key[: CONSTANTS.TOKEN_KEY_LENGTH], user_id=user_id, expiry=expiry)
                for key, user_id in rows
            ],
            ignore_conflicts=True,
        )
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [
        ("knox", "0009_extend_authtoken_field"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [migrations.RunPython(hash_legacy_tokens, migrations.RunPython.noop)]
