"""Budget 3 of the pipeline benchmark: signals accepted over HTTP against bare inserts of
the same rows (bench/ingest_client.py, a few processes each way), in alternating slices."""

from __future__ import annotations

import base64
import json
import statistics
import sys
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from accounts.services import token_issue
from bench.common import PROJECT_DIR, gunicorn, json_answer, progress
from bench.pipeline_data import SIGNAL_TABLE, vacuum
from bench.report import ms

INGEST_BUDGET = 0.7  # signals accepted over HTTP, at least 0.7x the bare insert of the same rows
CELERY_QUEUE = "celery"


def rate(value: float) -> str:
    return f"{value:,.0f} signals/s"


class Ingest:
    """PipelineBench's budget 3 (it has the connection, the options, the broker, the children)."""

    def ingest(self) -> None:
        args = self.args
        sender = get_user_model().objects.get(pk=self.data.sender_id)  # a service account that may add signals
        sender.user_permissions.add(
            Permission.objects.get(content_type__app_label="signals_app", codename="add_signal")
        )
        sender.groups.add(Group.objects.get_or_create(name=settings.SERVICE_ACCOUNT_GROUP)[0])
        token = token_issue(user=sender)[1]
        database = [self.child_env["DATABASE_URL"], "--sender-id", str(sender.pk)]
        server, base = gunicorn(self.children, self.child_env, args.ingest_workers)
        # The floor and the API take turns, a slice each, against the same server: this
        # machine's speed drifts over minutes, and a ratio of neighbours cancels the drift.
        seconds = args.ingest_seconds / args.ingest_slices
        floor: list[dict[str, Any]] = []
        served: list[dict[str, Any]] = []
        try:
            for number in range(1, args.ingest_slices + 1):
                progress(
                    f"ingest slice {number}/{args.ingest_slices}: {args.ingest_clients} clients, {seconds:g} s with "
                    f"psycopg, then {seconds:g} s over HTTP (gunicorn, {args.ingest_workers} sync workers)"
                )
                floor.append(self.run_clients("sql", database, seconds))
                stored = self.conn.execute(f"SELECT count(*) FROM {SIGNAL_TABLE}").fetchone()[0]
                self.check(
                    stored == floor[-1]["total_signals"], f"the ingest floor stored what it inserted ({stored:,})"
                )
                self.broker.flushdb()
                served.append(self.run_clients("http", [base], seconds, {"BENCH_API_TOKEN": token}))
                self.check_ingested(served[-1])
            progress("ingest floor again, the arrays as binary parameters (as the API's insert sends them)")
            binary = self.run_clients("sql-binary", database, seconds)
        finally:
            self.children.stop(server)
        floor_rate = sum(r["signals"] for r in floor) / args.ingest_seconds
        accepted_rate = sum(r["signals"] for r in served) / args.ingest_seconds
        self.at_least(
            f"3. ingest, POST /api/signals/ with 1,000 signals (half keyed), gunicorn {args.ingest_workers} sync "
            f"workers (deploy/gunicorn.conf.py), {args.ingest_clients} clients, {args.ingest_slices} slices of "
            f"{seconds:g} s alternated with the floor's",
            rate(accepted_rate),
            f"{rate(floor_rate)} (psycopg INSERT … unnest, {args.ingest_clients} connections)",
            accepted_rate / floor_rate,
            INGEST_BUDGET,
        )
        pairs = ", ".join(f"{h['signals'] / f['signals']:.2f}x" for f, h in zip(floor, served, strict=True))
        self.note(f"3. ingest vs floor, slice by slice ({seconds:g} s each)", pairs)
        binary_rate = binary["signals"] / seconds
        self.note(
            "3. the same ingest against the floor with binary array parameters (psycopg's %b: no text"
            f" formatting or parsing of each element; one slice of {seconds:g} s)",
            rate(accepted_rate),
            f"{rate(binary_rate)} (psycopg INSERT … unnest, binary parameters)",
            f"{accepted_rate / binary_rate:.2f}x",
        )
        latencies = sorted(latency for r in served for latency in r["latencies"])
        floor_latencies = [latency for r in floor for latency in r["latencies"]]
        if latencies and floor_latencies:
            p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
            self.note(
                f"3. ingest request latency, {len(latencies):,} requests in the windows",
                f"median {ms(statistics.median(latencies))}, p95 {ms(p95)}",
                f"median {ms(statistics.median(floor_latencies))} a floor batch",
            )

    def check_ingested(self, result: dict[str, Any]) -> None:
        errors, accepted = result["errors"], result["total_signals"]
        stored, keyed = self.conn.execute(f"SELECT count(*), count(idempotency_key) FROM {SIGNAL_TABLE}").fetchone()
        pending = {row[0] for row in self.conn.execute(f"SELECT id FROM {SIGNAL_TABLE} WHERE outcome = 0")}
        # The tasks waiting on the Celery queue and the signal ids they carry (no worker runs during ingest).
        messages = self.broker.lrange(CELERY_QUEUE, 0, -1)
        queued = [i for message in messages for i in json.loads(base64.b64decode(json.loads(message)["body"]))[0][0]]
        self.broker.flushdb()
        self.check(errors == 0, f"every ingest request answered 202 ({errors} did not: {result['first_error']})")
        self.check(stored == accepted, f"the API stored what it accepted ({stored:,} vs {accepted:,})")
        self.check(
            2 * keyed == stored, f"half of the ingested signals carry an idempotency key ({keyed:,} of {stored:,})"
        )
        self.check(
            sorted(queued) == sorted(pending),
            f"the API enqueued every pending signal it stored, once ({len(queued):,} ids in {len(messages):,} tasks"
            f" on Redis, {len(pending):,} pending, {stored - len(pending):,} gated on receipt)",
        )

    def run_clients(self, mode: str, target: list[str], seconds: float, env: dict[str, str] | None = None) -> Any:
        """Empty the signals, then run the clients for ``seconds`` after a warm-up; their results added up."""
        self.conn.execute(f"TRUNCATE {SIGNAL_TABLE} RESTART IDENTITY")
        vacuum(self.conn, (SIGNAL_TABLE,))
        start = time.time() + (2.0 if self.args.quick else 3.0)
        end = start + seconds
        argv = [sys.executable, str(PROJECT_DIR / "bench" / "ingest_client.py"), mode, *target]
        argv += ["--seed", str(self.args.seed), "--start", f"{start:.6f}", "--end", f"{end:.6f}"]
        env = {**self.child_env, **(env or {})}
        clients = [
            self.children.start(f"client-{n}", [*argv, "--client", str(n)], env=env, cwd=PROJECT_DIR)
            for n in range(self.args.ingest_clients)
        ]
        results = [json_answer(self.children, client, max(end - time.time(), 0) + 120) for client in clients]
        merged = {key: sum(r[key] for r in results) for key in ("signals", "total_signals", "errors")}
        merged["latencies"] = [latency for r in results for latency in r["latencies"]]
        merged["first_error"] = next((r["first_error"] for r in results if r["first_error"]), "")
        return merged
