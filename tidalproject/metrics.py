"""Prometheus metrics that add up across processes.

With PROMETHEUS_MULTIPROC_DIR set (one directory per machine, emptied before the processes
start), every gunicorn and Celery worker process writes its samples there and ``/metrics``
on any web process of that machine serves them all, summed. Without it, each process serves
its own (fine for the single-process development server).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client import REGISTRY as DEFAULT_REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

SIGNALS_ACCEPTED = Counter("tidal_signals_accepted", "Signals stored by the API (duplicates not counted).")
SIGNALS_PROCESSED = Counter("tidal_signals_processed", "Signals given an outcome.", ["outcome", "stage"])
SIGNALS_GATED = Counter("tidal_signals_gated", "Signals gated, by the reason recorded.", ["reason"])
SIGNALS_ENQUEUE_FAILED = Counter(
    "tidal_signals_enqueue_failed", "Stored signals whose processing task could not be sent (left to the sweep)."
)
SIGNALS_REQUEUED = Counter("tidal_signals_requeued", "Pending signals the sweep enqueued again.")
SIGNALS_SUPPRESSED = Counter(
    "tidal_signals_suppressed", "Signals of erased users (still left) dropped at ingest, never stored."
)
SIGNALS_ERASED = Counter(
    "tidal_signals_erased",
    "Signals deleted by erasures: by the erasure itself, at processing (received before it), or by the sweep.",
    ["stage"],
)
ERASURES = Counter("tidal_erasures", "Erasures that wrote a receipt.", ["source"])
LEAVE_CHANGES = Counter("tidal_leave_changes", "Leave records changed.", ["action", "source"])
FENCE_SYNCS = Counter("tidal_leave_fence_syncs", "Leave fence syncs, by what they found.", ["result"])
CACHE_WARM_SECONDS = Histogram(
    "tidal_leave_cache_warm_seconds", "Time to warm a leave cache.", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
)
CACHE_SIZE = Gauge(
    "tidal_leave_cache_size", "Users held as gated by a process's leave cache.", multiprocess_mode="liveall"
)
BATCH_SECONDS = Histogram(
    "tidal_signal_batch_seconds",
    "Time to process one batch of signals.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
LOGIN_FAILURES = Counter(
    "tidal_login_failures",
    "Refused log-ins, by door (admin, api) and reason (credentials, or locked: refused during a lockout).",
    ["entry", "reason"],
)
LOGIN_LOCKOUTS = Counter("tidal_login_lockouts", "Lockouts of an account from a client address, by door.", ["entry"])
SIGNAL_AGE_SECONDS = Histogram(
    "tidal_signal_age_seconds",
    "From a signal's receipt to its processing (the oldest of each batch).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)

WEBHOOK_ATTEMPTS = Counter("tidal_webhook_attempts", "Webhook delivery attempts, by result (ok, failed).", ["result"])
WEBHOOK_FIRST_ATTEMPT_SECONDS = Histogram(
    "tidal_webhook_first_attempt_seconds",
    "From a change's commit to the first attempt to deliver it.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# Gauges read from the database when /metrics is scraped (apps register them in ready(),
# so that this module imports no app): each returns metric families to serve.
SCRAPE_COLLECTORS: list[Callable[[], Iterable[Metric]]] = []


class _ScrapeCollector(Collector):
    def collect(self) -> Iterable[Metric]:
        for collect in SCRAPE_COLLECTORS:
            yield from collect()


def metrics_view(request: HttpRequest) -> HttpResponse:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = DEFAULT_REGISTRY
    if SCRAPE_COLLECTORS:
        scraped = CollectorRegistry()
        scraped.register(_ScrapeCollector())
        body = generate_latest(registry) + generate_latest(scraped)
        return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
