"""Celery tasks: thin, by id, retried on transient database errors."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from tidalproject.celery import sweep_task

from .erasure import erasure_job_run, erasures_settle, stalled_erasure_jobs_restart
from .services.processing import TRANSIENT_ERRORS, signals_process_isolating_failures
from .services.sweep import pending_signals_requeue


@shared_task(
    acks_late=True,  # a worker that dies mid-batch leaves the message to be redelivered
    reject_on_worker_lost=True,
    autoretry_for=TRANSIENT_ERRORS,  # database down, deadlock, fence unreadable
    retry_backoff=True,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=20,  # after that the signals are still pending: the sweep takes them up
    soft_time_limit=120,
    time_limit=180,
    ignore_result=True,
)
def process_signal_batch(signal_ids: list[int]) -> dict[str, int]:
    report = signals_process_isolating_failures(signal_ids=signal_ids)
    return asdict(report)


@sweep_task
def sweep_pending_signals() -> dict[str, int | None]:
    report = pending_signals_requeue(older_than=timedelta(seconds=settings.SIGNAL_SWEEP_AFTER_SECONDS))
    # The erasures' safety nets: anything an erasure could not see, and bulk jobs whose task died.
    settled = erasures_settle()
    restarted = stalled_erasure_jobs_restart(older_than=timedelta(seconds=settings.ERASURE_JOB_RESTART_AFTER_SECONDS))
    return {**asdict(report), "erasures_settled": settled, "erasure_jobs_restarted": restarted}


@shared_task(
    acks_late=True,  # a worker killed mid-job leaves the message to be delivered again: it resumes
    reject_on_worker_lost=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=True,
    retry_backoff_max=60,
    max_retries=20,  # after that the sweep restarts the job
    soft_time_limit=3600,
    time_limit=3700,
    ignore_result=True,
)
def run_erasure_job(job_id: int) -> dict[str, int | str]:
    job = erasure_job_run(job_id=job_id)
    return {"job": job.pk, "state": job.state}
