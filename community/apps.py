from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CommunityConfig(AppConfig):
    name = "community"
    verbose_name = "Community layer"

    def ready(self) -> None:
        # No query here: ready() also runs for migrate on an empty database and for the
        # test database set-up. The leave cache warms after fork instead: in each Celery
        # worker child on worker_process_init, and in a web process on its first gate use.
        # Connecting with a dispatch_uid keeps ready() idempotent.
        from celery.signals import worker_process_init

        from .cache import warm_after_worker_fork

        worker_process_init.connect(warm_after_worker_fork, dispatch_uid="community.warm_leave_cache")

        # Webhook lag gauges are read from the database when /metrics is scraped (no query here).
        from tidalproject import metrics

        from .webhooks.lag import lag_metrics

        if lag_metrics not in metrics.SCRAPE_COLLECTORS:
            metrics.SCRAPE_COLLECTORS.append(lag_metrics)
        # ``flush`` deletes the clock row and then sends post_migrate: put a new one back
        # (with a new epoch), so the fence never stays unreadable after a flush.
        post_migrate.connect(ensure_leave_clock, sender=self, dispatch_uid="community.ensure_leave_clock")


def ensure_leave_clock(*, apps: Any = None, using: str = "default", **_: Any) -> None:
    """Create the clock row if it is missing (with the models as the migrations left them,
    after migrate; flush sends no ``apps``, the schema is then the current one)."""
    if apps is None:
        from django.apps import apps
    try:
        clock = apps.get_model("community", "LeaveClock")
    except LookupError:  # community's migrations have not run yet
        return
    clock.objects.using(using).get_or_create(pk=1)
