"""gunicorn settings for the web processes (``gunicorn -c deploy/gunicorn.conf.py tidalproject.wsgi``)."""

import multiprocessing
import os

bind = os.environ.get("BIND", "127.0.0.1:8000")
# Sync workers: each request holds one process; the work is short and database-bound.
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count() * 2 + 1))
timeout = 30
graceful_timeout = 20
max_requests = 10_000  # recycle a worker now and then; its leave cache re-warms on first use
max_requests_jitter = 1_000
accesslog = "-"


def child_exit(server, worker):
    # Drop the samples of a worker that exited from the shared Prometheus directory.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
