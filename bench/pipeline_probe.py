"""Instruments of the pipeline benchmark's budget 2, used in the benchmark's own process.

The product's code is not changed: its functions are wrapped for the time of a measurement
(gate() on the manager instance, SQL through Django's execute_wrapper, the commit on the
connection object) and put back afterwards.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connections

from community.cache import leave_cache
from community.cache.gate import LeaveGate
from signals_app.services import processing
from signals_app.services.processing import signals_process

PROJECT_DIR = Path(__file__).resolve().parent.parent


def top_functions(profiler: cProfile.Profile, count: int) -> str:
    """The functions that took most time of their own, then the project's by cumulative time.

    Paths are shown relative to the project folder (site-packages relative to the environment).
    """

    def listing(sort: pstats.SortKey, *restrictions: Any) -> list[str]:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(*restrictions)
        lines = out.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
        return [line for line in lines[start:] if line.strip()]

    out = io.StringIO()
    pstats.Stats(profiler, stream=out).print_stats(0)
    total = next((line.strip() for line in out.getvalue().splitlines() if "function calls" in line), "")
    own = listing(pstats.SortKey.TIME, count)
    project = listing(pstats.SortKey.CUMULATIVE, rf"{re.escape(str(PROJECT_DIR))}/(signals_app|community)/", count)
    text = "\n".join([total, "", "By own time:", *own, "", "The project's functions by cumulative time:", *project])
    text = re.sub(r"[^ ]*/site-packages/", "", text.replace(f"{PROJECT_DIR}/", ""))
    return re.sub(r" at 0x[0-9a-f]+", "", text)  # addresses change from run to run


class Probe:
    """Times signals_process per batch, gate() inside it, each SQL statement, and the commit.

    gate() is wrapped on the manager instance, SQL through Django's execute_wrapper, the
    commit on the connection object: one clock pair per call, a few per batch.
    """

    STATEMENTS = (
        ("lock pending rows (SELECT … FOR UPDATE SKIP LOCKED)", "FOR UPDATE"),
        ("credit and mark (one statement: the membership joins, both upserts, the outcomes)", "ON CONFLICT"),
    )

    def __init__(self) -> None:
        self.total = 0.0
        self.gate = 0.0
        self.steps = 0.0  # the seed's two gated steps (the gate applied to the batch's users)
        self.preload = 0.0  # the while-queued check's history read, where memory does not cover it
        self.commit = 0.0
        self.sql: Counter[str] = Counter()
        self.statements: Counter[str] = Counter()
        self.processed = 0
        self.batches = 0

    def classify(self, sql: str) -> str:
        if "leaveclock" in sql or "leavehistory" in sql:
            return "fence"  # inside gate() or gate.preload(), each timed as a whole
        for name, marker in self.STATEMENTS:
            if marker in sql:
                return name
        return "other SQL"

    def execute(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            name = self.classify(sql)
            self.statements[name] += 1
            if name != "fence":
                self.sql[name] += elapsed

    @contextmanager
    def installed(self) -> Iterator[None]:
        db = connections["default"]
        wrapped = [
            (leave_cache, "sync", "gate"),
            (db, "_commit", "commit"),
            (LeaveGate, "preload", "preload"),
            (processing, "try_cohort_attribution", "steps"),
            (processing, "try_community_forwarding", "steps"),
        ]
        originals = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in wrapped]
        for owner, name, total in wrapped:
            setattr(owner, name, self._timed(getattr(owner, name), total))
        try:
            with db.execute_wrapper(self.execute):
                yield
        finally:
            for owner, name, original in originals:
                if original is None:
                    delattr(owner, name)  # an instance's attribute: the class's method shows again
                else:
                    setattr(owner, name, original)

    def _timed(self, function: Callable[..., Any], total: str) -> Callable[..., Any]:
        """``function``, adding the seconds of each call to ``self.<total>``."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                setattr(self, total, getattr(self, total) + time.perf_counter() - started)

        return timed

    def batch(self, ids: list[int]) -> None:
        started = time.perf_counter()
        report = signals_process(signal_ids=ids)
        self.total += time.perf_counter() - started
        self.processed += report.processed
        self.batches += 1

    def breakdown(self) -> dict[str, float]:
        """Seconds by phase; a statement's name says how many of it a batch runs."""

        def each(name: str) -> str:
            return f"{name}, {self.statements[name] / max(self.batches, 1):g} a batch"

        phases = {
            "gate() (the fence read, one query)": self.gate,
            "gate.preload() (the while-queued check: nothing to read when the feed covers it)": self.preload,
            "the two gated steps (the gate applied to the batch's users)": self.steps,
        }
        phases |= {each(name): seconds for name, seconds in self.sql.items()}
        phases["COMMIT"] = self.commit
        phases["Python (the rest: ORM, building the rows)"] = self.total - sum(phases.values())
        return phases
