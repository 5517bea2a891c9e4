"""Time and memory of ``verify_stop_forward`` over a large table of signals (10,000,000; --quick
200,000), made in SQL with every case it checks. Exits 1 if it does not pass on this consistent
data, or passes once an aggregate and an outcome are altered."""

from __future__ import annotations

import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, report, tools

DATABASE = "tidal_bench_verify"
START, END = "<!-- verify:start -->", "<!-- verify:end -->"
TITLE = "## The stop-forward verifier\n\n"

USERS = 1_000_000
LEAVERS = 100_000  # users 1..LEAVERS left at version = their id
WINDOW = 10  # each signal's processing fence is its receipt fence + WINDOW


def fill(conn: Any, signals: int, sender: int) -> None:
    tools.make_groups(conn, 200, 50, datetime.now(UTC))
    # Users 1..LEAVERS left at version = their id: a LEFT record (status byte 1).
    conn.execute(
        "INSERT INTO community_leavehistory (version, user_id, action, value, actor_label, source, at, reason) "
        "SELECT u, u, 'leave', '\\x01'::bytea || int8send(u)::bytea, '', 'command', now(), '' "
        "FROM generate_series(1, %s) u",
        [LEAVERS],
    )
    conn.execute(
        "INSERT INTO community_communityleave (user_id, value) SELECT user_id, value FROM community_leavehistory"
    )
    conn.execute("UPDATE community_leaveclock SET version = %s", [LEAVERS])
    # A signal's user is (id mod USERS) + 1, its receipt fence id mod LEAVERS, processing
    # fence WINDOW later. A leaver whose leave version is at or before the receipt fence
    # was left at receipt; one whose leave falls in the window, left at processing (both
    # gated); otherwise (and for users who never left) the signal is attributed.
    conn.execute(
        """
        INSERT INTO signals_app_signal (id, sender_id, user_id, item_id, kind, weight, occurred_at, received_at,
            processed_at, fence_at_receipt, fence_at_processing, outcome, gated_reason,
            credited_communities, credited_cohorts, error)
        SELECT s.id, %(sender)s, s.u, s.id %% 1000, (ARRAY['view','like','share'])[1 + s.id %% 3], 1 + s.id %% 4,
               s.at, s.at, s.at, s.r,
               CASE WHEN NOT g.at_receipt THEN s.r + %(window)s END,
               CASE WHEN g.gated THEN 2 ELSE 1 END,
               CASE WHEN g.at_receipt THEN 1 WHEN g.gated THEN 3 END,
               CASE WHEN NOT g.gated
                    THEN jsonb_build_array(1 + s.u %% 200, 1 + (s.u + 67) %% 200, 1 + (s.u + 133) %% 200) END,
               CASE WHEN NOT g.gated THEN jsonb_build_array(1 + s.u %% 50, 1 + (s.u + 25) %% 50) END,
               ''
        FROM (
            SELECT n AS id, 1 + n %% %(users)s AS u, n %% %(leavers)s AS r,
                   now() - make_interval(secs => (n %% 259200)) AS at
            FROM generate_series(1, %(signals)s) n
        ) s CROSS JOIN LATERAL (
            SELECT s.u <= %(leavers)s AND s.u <= s.r AS at_receipt,
                   s.u <= %(leavers)s AND s.u <= s.r + %(window)s AS gated
        ) g
        """,
        {"sender": sender, "leavers": LEAVERS, "window": WINDOW, "users": USERS, "signals": signals},
    )
    conn.execute("SELECT setval(pg_get_serial_sequence('signals_app_signal', 'id'), %s)", [signals])
    tools.add_up_aggregates(conn)
    conn.execute("VACUUM ANALYZE")


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="200,000 signals: a smoke run")
    parser.add_argument("--signals", type=int, help="signals (default 10,000,000; 200,000 quick)")
    args = common.parse(parser, argv, {"signals": (200_000, 10_000_000)})
    found = report.Results()
    with common.database(DATABASE, args.server) as url:
        import psycopg
        from django.contrib.auth import get_user_model

        from signals_app.models import CommunityAggregate, Outcome, Signal
        from signals_app.verification import verify_stop_forward

        sender = get_user_model().objects.create(username="bench").pk
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            fill(conn, args.signals, sender)
        filled = time.perf_counter() - started
        common.progress(f"filled {args.signals:,} signals in {filled:.1f} s")

        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        result = verify_stop_forward(progress=True)
        seconds = time.perf_counter() - started
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        found.check(result.passed, f"the verifier passes on consistent data ({result.counterexamples} counterexamples)")
        found.check(result.signals_checked == args.signals, f"it checked every signal ({result.signals_checked:,})")
        # The same run must fail, naming both, once an aggregate and an outcome are altered.
        aggregate = CommunityAggregate.objects.earliest("id")
        CommunityAggregate.objects.filter(pk=aggregate.pk).update(count=aggregate.count + 1)
        gated = Signal.objects.filter(outcome=Outcome.GATED, gated_reason=3).earliest("id")
        Signal.objects.filter(pk=gated.pk).update(outcome=Outcome.ATTRIBUTED, gated_reason=None)
        altered = verify_stop_forward(progress=False)
        named = "\n".join(altered.named)
        found.check(
            altered.counterexamples == 2 and f"signal {gated.pk} " in named and "aggregate community" in named,
            "it fails on an altered aggregate and an altered outcome, naming both",
        )

    found.note(
        f"verify_stop_forward over {args.signals:,} signals ({result.attributed:,} attributed, "
        f"{result.gated:,} gated), {LEAVERS:,} history rows, {result.aggregate_rows_checked:,} aggregate rows",
        f"{seconds:,.1f} s ({args.signals / seconds:,.0f} signals/s)",
    )
    found.note(
        "peak resident memory of the verifying process (ru_maxrss)",
        f"{rss_peak / 1024:,.0f} MiB (before the run: {rss_before / 1024:,.0f} MiB)",
    )
    passed_text = (
        "All checks passed: the verifier passes on this consistent data, checking every signal, and fails on an "
        "altered aggregate and an altered outcome, naming both."
    )
    facts = [("data", f"made in the database in {filled:,.0f} s (not part of the figures)")]
    return common.finish(args, "verify.py", argv, facts, found, passed_text, (START, END), TITLE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
