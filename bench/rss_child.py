"""Resident memory of one full warm, or of the floor's fetchall, in a fresh process.

Run by run.py with its environment (``python bench/rss_child.py warm|floor``); prints JSON.
tracemalloc sees Python's allocators only; the resident set also holds libpq's result
buffer, and a fresh process has no freed memory of earlier rounds to reuse.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(what: str) -> None:
    import django
    import psycopg

    django.setup()
    from bench import tools
    from bench.phases import FLOOR_WARM_SQL
    from community.cache import leave_cache, leave_gate
    from community.models import LeaveClock

    if what == "warm":
        LeaveClock.objects.get(pk=1)  # connect first: the connection is not the warm's cost
        _, peak = tools.rss_peak(leave_gate)
        print(json.dumps({"peak": peak}))
    elif what == "retained":
        # What a warmed process keeps for its gate: a first warm loads and sets up everything
        # else a process keeps anyway (modules, compiled queries, the connection's buffers);
        # the gate is then dropped, and what a second warm keeps is the gate's own memory.
        LeaveClock.objects.get(pk=1)
        started = time.perf_counter()
        leave_gate()
        seconds = time.perf_counter() - started
        leave_cache.reset()
        gate, retained = tools.rss_retained(leave_gate)
        size = leave_cache.size
        rss = tools.resident_bytes()
        print(json.dumps({"retained": retained, "held": size, "seconds": seconds, "rss": rss, "gate": bool(gate)}))
    else:
        conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _, peak = tools.rss_peak(lambda: conn.execute(FLOOR_WARM_SQL).fetchall())
        print(json.dumps({"peak": peak}))


if __name__ == "__main__":
    main(sys.argv[1])
