from django.apps import AppConfig


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

        from .webhooks import lag_metrics

        if lag_metrics not in metrics.SCRAPE_COLLECTORS:
            metrics.SCRAPE_COLLECTORS.append(lag_metrics)
