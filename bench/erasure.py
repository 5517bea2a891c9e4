"""Erasing one user with 100,000 attributed signals, against a hand-written SQL floor (bench/erasure.md).
Its own database (tidal_bench_erasure), filled in SQL: per round one user for each side."""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common, report, tools

DATABASE = "tidal_bench_erasure"
START, END = "<!-- bench:erasure:start -->", "<!-- bench:erasure:end -->"
BUDGET = 2.0


def floor_erase(user_id: int) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn, conn.transaction():
        conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM signals_app_signal WHERE user_id = %s FOR UPDATE) t", [user_id]
        )
        for table, target, credited in reversed(tools.AGGREGATES):
            conn.execute(
                f"""
                WITH removed AS (
                    SELECT c.t::bigint AS target,
                           date_trunc('hour', s.occurred_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour,
                           s.item_id, s.kind, count(*) AS n, sum(s.weight) AS w, max(s.occurred_at) AS last
                    FROM signals_app_signal s CROSS JOIN LATERAL jsonb_array_elements_text(s.{credited}) c(t)
                    WHERE s.user_id = %(u)s AND s.outcome = 1 GROUP BY 1, 2, 3, 4
                ), gone AS (
                    DELETE FROM {table} a USING removed r
                    WHERE a.{target} = r.target AND a.hour = r.hour AND a.item_id = r.item_id AND a.kind = r.kind
                      AND a.count - r.n <= 0
                )
                UPDATE {table} a SET count = a.count - r.n, weight_sum = a.weight_sum - r.w,
                       last_at = CASE WHEN a.last_at > r.last THEN a.last_at ELSE coalesce((
                           SELECT max(s.occurred_at) FROM signals_app_signal s
                           WHERE s.outcome = 1 AND s.item_id = r.item_id AND s.kind = r.kind
                             AND s.occurred_at >= r.hour AND s.occurred_at < r.hour + interval '1 hour'
                             AND s.{credited} @> to_jsonb(r.target) AND s.user_id <> %(u)s
                       ), a.last_at) END
                FROM removed r
                WHERE a.{target} = r.target AND a.hour = r.hour AND a.item_id = r.item_id AND a.kind = r.kind
                  AND a.count - r.n > 0
                """,
                {"u": user_id},
            )
        conn.execute("DELETE FROM signals_app_signal WHERE user_id = %s", [user_id])


def fill(url: str, erased: list[int], signals: int, sender: int) -> None:
    """``signals`` attributed signals of each erased user, as many in all for 200 others a few
    seconds earlier in each minute on the same items, all credited to every group, and the
    aggregates they add up to."""
    insert = (
        "INSERT INTO signals_app_signal (sender_id, user_id, item_id, kind, weight, occurred_at, received_at,"
        " outcome, processed_at, fence_at_receipt, fence_at_processing, credited_communities, credited_cohorts,"
        " error) SELECT %(sender)s, {user}, g %% 500, (ARRAY['view','like','share'])[1 + g %% 3],"
        " 1 + (g %% 4) * 0.5, date_trunc('hour', now()) - interval '1 day' + (g %% 1440) * interval '1 minute'"
        " + {offset}, now(), 1, now(), 0, 0, (SELECT jsonb_agg(id) FROM community_community),"
        " (SELECT jsonb_agg(id) FROM community_cohort), ''"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        tools.make_groups(conn, 3, 2, datetime.now(UTC))
        conn.execute(
            insert.format(user="u", offset="interval '7 seconds'")
            + " FROM unnest(%(users)s::bigint[]) u, generate_series(1, %(n)s) g",
            {"sender": sender, "n": signals, "users": erased},
        )
        conn.execute(
            insert.format(user="1000 + g %% 200", offset="interval '3 seconds'")
            + " FROM generate_series(1, %(n)s) g WHERE g %% 5 <> 0",
            {"sender": sender, "n": signals},
        )
        tools.add_up_aggregates(conn)
        conn.execute("VACUUM ANALYZE")


def main(argv: list[str]) -> int:
    parser = common.arguments(__doc__, quick="5,000 signals a user, 1 round: a smoke run")
    parser.add_argument("--signals", type=int, help="attributed signals of each erased user (default 100,000)")
    parser.add_argument("--rounds", type=int, help="default 3")
    args = common.parse(parser, argv, {"signals": (5_000, 100_000), "rounds": (1, 3)})
    with common.database(DATABASE, args.server) as url:
        from django.contrib.auth import get_user_model

        from signals_app.erasure import user_erase
        from signals_app.models import Signal
        from signals_app.verification import verify_stop_forward

        sender = get_user_model().objects.create(username="bench-sender")
        started = time.perf_counter()
        fill(url, list(range(1, 2 * args.rounds + 1)), args.signals, sender.pk)
        filled = time.perf_counter() - started
        total = Signal.objects.count()
        changed = 0
        seconds: dict[str, list[float]] = {"product": [], "floor": []}
        for round_ in range(args.rounds):
            # Users 2r+1 for the product, 2r+2 for the floor; which goes first alternates.
            steps = [("product", 2 * round_ + 1), ("floor", 2 * round_ + 2)]
            for name, user_id in steps if round_ % 2 == 0 else steps[::-1]:
                started = time.perf_counter()
                if name == "product":
                    changed = user_erase(user_id=user_id).aggregate_rows_changed
                else:
                    floor_erase(user_id)
                seconds[name].append(time.perf_counter() - started)
        verified = verify_stop_forward(progress=False)
    product, floor = (statistics.median(seconds[name]) for name in ("product", "floor"))
    each = {name: ", ".join(f"{x:.3f}" for x in values) for name, values in seconds.items()}
    found = report.Results()
    found.budget(
        f"`user_erase` of one user with {args.signals:,} attributed signals, {changed:,}"
        f" aggregate rows changed (median of {args.rounds})",
        f"{product:.3f} s ({each['product']})",
        f"{floor:.3f} s (hand-written SQL: {each['floor']})",
        report.ratio(product / floor),
        f"≤ {BUDGET:g}x",
        product / floor <= BUDGET,
    )
    found.check(verified.passed, "verify_stop_forward afterwards: " + "; ".join(verified.named[:10]))
    facts = [("data", f"{total:,} signals, made in the database in {filled:.0f} s")]
    passed_text = "`verify_stop_forward` passed afterwards."
    description = Path(__file__).with_name("erasure.md").read_text()
    return common.finish(args, "erasure.py", argv, facts, found, passed_text, (START, END), description)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
