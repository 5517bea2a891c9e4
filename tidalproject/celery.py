"""The Celery application, configured from Django settings (``CELERY_`` namespace)."""

import os

from celery import Celery
from celery.signals import task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tidalproject.settings.dev")

app = Celery("tidalproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _drop_broken_connections(**_: object) -> None:
    # Connections are kept across tasks (CELERY_DB_REUSE_MAX); like Django at the start of a
    # request, drop one that broke (say, the database restarted) or outlived CONN_MAX_AGE.
    from django.db import close_old_connections

    close_old_connections()
