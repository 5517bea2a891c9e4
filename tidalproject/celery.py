"""The Celery application, configured from Django settings (``CELERY_`` namespace)."""

import os
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from celery import Celery, Task, shared_task
from celery.signals import task_prerun
from django.db import InterfaceError, OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tidalproject.settings.dev")

app = Celery("tidalproject")

P = ParamSpec("P")
R = TypeVar("R")


def sweep_task(function: Callable[P, R]) -> Task[P, R]:
    """The periodic sweeps' task (beat's): retried a few times on a database that went away,
    time-limited, no result kept. One definition for every app's sweep."""
    return shared_task(
        autoretry_for=(OperationalError, InterfaceError),
        retry_backoff=True,
        max_retries=3,
        soft_time_limit=60,
        time_limit=90,
        ignore_result=True,
    )(function)


app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
def _drop_broken_connections(**_: object) -> None:
    # Connections are kept across tasks (CELERY_DB_REUSE_MAX); like Django at the start of a
    # request, drop one that broke (say, the database restarted) or outlived CONN_MAX_AGE.
    from django.db import close_old_connections

    close_old_connections()


def queued_task_count(queue: str | None = None) -> int | None:
    """How many tasks wait in ``queue`` (the default queue) at the broker, or None when the
    broker cannot say (or cannot be reached)."""
    from kombu.exceptions import ChannelError

    name = queue or app.conf.task_default_queue
    try:
        with app.connection_for_read() as connection:
            connection.ensure_connection(max_retries=1)
            try:
                channel: Any = connection.default_channel
                _, count, _ = channel.queue_declare(queue=name, passive=True)
            except ChannelError:
                return 0  # kombu's Redis transport: an empty queue has no key, so "not found"
            return int(count)
    except Exception:  # noqa: BLE001 - a broker that cannot answer is "unknown", not an error
        return None
