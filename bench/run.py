"""Measure the leave cache's budgets against floors taken in the same run; see BENCHMARKS.md.

    python bench/run.py                   # 1,000,000 records, writes BENCHMARKS.md
    python bench/run.py --quick           # 100,000 records, fewer rounds
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
    parser.add_argument(
        "--records",
        type=int,
        help="records to warm from (default 1,000,000; 100,000 with --quick); below 50,000 a "
        "Python set's growth step alone can exceed the 100 B/record budget",
    )
    parser.add_argument("--scale", type=int, help="gated users of the warm at scale (default 10,000,000; 0: skip)")
    args = common.parse(parser, argv, {"records": (100_000, 1_000_000), "scale": (0, 10_000_000)})
    if args.records < 1_000:
        parser.error("--records must be at least 1,000")
    # The cache logs each warm at INFO: LOG_LEVEL=WARNING keeps the timed runs quiet.
    with common.database(DATABASE, args.server) as url:
        import psycopg

        from bench import report, tools
        from bench.phases import Bench, Options

        quick = args.quick
        options = Options(
            records=args.records,
            active_share=0.10,
            warm_rounds=3 if quick else 7,
            lookup_rounds=10 if quick else 31,
            probes=200_000,
            fence_rounds=3 if quick else 7,
            fence_calls=300 if quick else 1_000,
            sync_steps=(1, 100, 10_000),
            sync_rounds=1 if quick else 3,
            seed=args.seed,
            scale_records=args.scale,
        )
        with psycopg.connect(url, autocommit=True) as conn:
            facts = common.machine(conn)
            bench = Bench(conn, options)
            bench.run()
    facts += [
        (
            "records",
            f"{options.records:,} ({options.active_share:.0%} ACTIVE), "
            f"ids drawn from 1..{tools.ID_SPACE * options.records:,}",
        ),
        ("probes", f"{options.probes:,}, half with a record, half without"),
        ("rounds", f"warm {options.warm_rounds}, look-ups {options.lookup_rounds}, fence {options.fence_rounds}"),
    ]
    command = common.command_line("run.py", argv)
    passed = bench.passed
    checks = common.checks_text(
        bench.failed_checks,
        "All correctness checks passed (the warmed cache gates exactly the LEFT records, look-ups run no query, "
        "a sync after leaves replays the feed and gates every leaver).",
    )
    parts = [("Budgets", report.markdown_table(bench.budgets)), ("For information", report.markdown_table(bench.info))]
    printed = [report.text_table("BUDGETS", bench.budgets), report.text_table("FOR INFORMATION", bench.info)]
    section = lambda: common.results_section(command, facts, [*parts, ("Checks", checks)], passed)  # noqa: E731
    return common.conclude(args, command, printed, bench.failed_checks, passed, section, (START, END))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
