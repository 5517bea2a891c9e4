"""Measure the leave cache's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/run.py                   # 1,000,000 records and a warm of 10,000,000, writes BENCHMARKS.md
    python bench/run.py --quick           # 100,000 records, fewer rounds, no warm at scale
    python bench/run.py --records 20000   # any size

Creates its own PostgreSQL database (tidal_bench) and drops it at the end (bench/common.py).
DEBUG off unless the environment sets it. Exits 1 when a budget is missed or a check fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common

DATABASE = "tidal_bench"
START, END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="100,000 records and fewer rounds, for a quick try")
    # Below 50,000 a Python set's growth step alone can miss the memory budget: it is meant for 1,000,000.
    parser.add_argument("--records", type=int, help="records to warm from (default 1,000,000; 100,000 with --quick)")
    args = common.parse(parser, argv, {"records": (100_000, 1_000_000)})
    # The look-ups' 100,000 probes without a record are drawn from the 9 x records ids of 1..10 x records
    # that have none: below about 11,100 records there are too few and the draw never ends.
    if args.records < 20_000:
        parser.error("--records must be at least 20,000")
    with common.database(DATABASE, args.server) as url:
        import psycopg

        from bench import phases

        with psycopg.connect(url, autocommit=True) as conn:
            facts = common.machine(conn)
            bench = phases.Bench(conn, args)
            bench.run()
    space = phases.ID_SPACE * args.records
    facts += [
        ("records", f"{args.records:,} ({phases.ACTIVE_SHARE:.0%} ACTIVE), ids drawn from 1..{space:,}"),
        ("probes", f"{phases.PROBES:,}, half with a record, half without"),
        ("rounds", f"warm {bench.rounds('warm')}, look-ups {bench.rounds('lookup')}, fence {bench.rounds('fence')}"),
    ]
    passed_text = (
        "All correctness checks passed (the warmed cache gates exactly the LEFT records, look-ups run no query, "
        "a sync after leaves replays the feed and gates every leaver)."
    )
    return common.finish(args, "run.py", argv, facts, bench, passed_text, (START, END))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
