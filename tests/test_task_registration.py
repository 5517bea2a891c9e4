"""Every task the beat schedule names is registered (PostHog's test_task_registration): a
schedule cannot name a task that was renamed or removed."""

from __future__ import annotations

from django.conf import settings

from tidalproject.celery import app


def test_every_task_in_the_beat_schedule_is_registered() -> None:
    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled, "the beat schedule is empty"
    missing = sorted(scheduled - set(app.tasks))
    assert not missing, f"the beat schedule names tasks that do not exist: {missing}"
