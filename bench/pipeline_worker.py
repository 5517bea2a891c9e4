"""Budget 1's product side: one real Celery worker on every pending signal (bench/pipeline.py)."""

from __future__ import annotations

import itertools
import math
import re
import sys
import time
from dataclasses import dataclass

from django.conf import settings

from bench.common import PROJECT_DIR, progress
from bench.pipeline_data import SIGNAL_TABLE
from bench.pipeline_ingest import CELERY_QUEUE
from signals_app.services.ingest import signals_enqueue
from support.processes import Child

PENDING_SQL = f"SELECT count(*) FROM {SIGNAL_TABLE} WHERE outcome = 0"
TASK_RUNTIME = re.compile(r"Task signals_app\.tasks\.process_signal_batch\[[^\]]+\] succeeded in ([0-9.]+)s")


@dataclass(frozen=True)
class WorkerRun:
    signals: int
    started: float  # epoch seconds, just before the worker was spawned
    batch_moments: list[float]  # each batch's processed_at, in order
    runtimes: list[float]  # seconds inside each task, from the worker's log
    sessions: int  # PostgreSQL sessions opened on the database while the worker ran

    @property
    def rate(self) -> float:
        """From the worker's start to its last batch's processed_at."""
        return self.signals / (self.batch_moments[-1] - self.started)

    @property
    def steady_rate(self) -> float:
        """From its first batch's processed_at to its last's: the first batch is not counted."""
        span = self.batch_moments[-1] - self.batch_moments[0]
        return (self.signals - self.signals / len(self.batch_moments)) / span if span > 0 else math.nan

    @property
    def boot(self) -> float:
        return self.batch_moments[0] - self.started

    @property
    def cycles(self) -> list[float]:
        moments = self.batch_moments
        return [later - earlier for earlier, later in itertools.pairwise(moments)] or [math.nan]


class Worker:
    """PipelineBench's worker runs (it has the connection, the data, the broker, the children)."""

    def run_worker(self) -> WorkerRun:
        """Enqueue every pending signal, start one worker, wait until none is pending."""
        count = len(self.data.signals)
        self.broker.flushdb()
        signals_enqueue(list(range(1, count + 1)))
        queued = self.broker.llen(CELERY_QUEUE)
        expected_tasks = math.ceil(count / settings.SIGNAL_BATCH_SIZE)
        self.check(queued == expected_tasks, f"{expected_tasks} tasks queued before the worker starts (found {queued})")
        argv = [sys.executable, "-m", "celery", "-A", "tidalproject", "worker", "--pool=prefork", "--concurrency=1"]
        # INFO: one "succeeded in" line a task, read below for the time spent inside each task.
        argv += ["--loglevel=INFO", "--without-heartbeat", "--without-gossip", "--without-mingle"]
        argv += ["--hostname", "bench-pipeline@%h"]
        sessions_before = self.sessions()
        worker = self.children.start("worker", argv, env=self.child_env, cwd=PROJECT_DIR, keep_lines=4 * queued + 200)
        try:
            self.wait_processed(worker, count)
        finally:
            self.children.stop(worker)
        sessions = self.sessions() - sessions_before
        left_in_queue = self.broker.llen(CELERY_QUEUE)
        self.check(left_in_queue == 0, f"the worker consumed every task (left in the queue: {left_in_queue})")
        self.broker.flushdb()
        moments = [
            row[0].timestamp()
            for row in self.conn.execute(f"SELECT DISTINCT processed_at FROM {SIGNAL_TABLE} ORDER BY processed_at")
        ]
        self.check(
            len(moments) == expected_tasks,
            f"the worker processed the signals in {expected_tasks} batches (found {len(moments)} processing times)",
        )
        # Only for information: absent if the project's logging ever hides Celery's task lines.
        runtimes = [float(seconds) for seconds in TASK_RUNTIME.findall(worker.output())]
        return WorkerRun(count, worker.started, moments, runtimes or [math.nan], sessions)

    def sessions(self) -> int:
        """Sessions ever opened on this database (PostgreSQL 14+), as the statistics say after a flush."""
        time.sleep(1.1)  # backends report their statistics at most once a second
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()
        return int(row[0])

    def wait_processed(self, worker: Child, count: int) -> None:
        """Wait until nothing is queued, then until nothing is pending; the timing itself comes
        from ``processed_at``. The queue's length is read from Redis, so that polling costs the
        database nothing while the worker runs, except for its last batches."""
        size = settings.SIGNAL_BATCH_SIZE
        last_seen, last_change, last_note = -1, time.monotonic(), time.monotonic()
        while True:
            queued = self.broker.llen(CELERY_QUEUE)
            pending = queued * size if queued else self.conn.execute(PENDING_SQL).fetchone()[0]
            if pending == 0:
                return
            now = time.monotonic()
            if not worker.running:
                raise RuntimeError(f"the worker exited ({worker.proc.returncode}):\n{worker.tail()}")
            if pending != last_seen:
                last_seen, last_change = pending, now
            elif now - last_change > 120:
                raise RuntimeError(f"no progress in 120 s, {pending:,} pending; worker output:\n{worker.tail()}")
            if now - last_note > 10:
                progress(f"about {count - pending:,} of {count:,} processed")
                last_note = now
            time.sleep(0.5 if queued else 0.1)
