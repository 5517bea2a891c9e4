"""What the benchmark scripts share: arguments, a database of their own, the machine's facts,
gunicorn, and printing and writing their results."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import report

PROJECT_DIR = Path(__file__).resolve().parent.parent
SETTINGS = "tidalproject.settings.dev"
SERVER = "postgres://127.0.0.1:5432"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def arguments(doc: str | None, *, quick: str) -> argparse.ArgumentParser:
    """A parser with the options every script has: --quick (``quick`` says what it runs), --server,
    --output, --no-write, --seed."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--server", default=SERVER, help="PostgreSQL server URL, no database")
    parser.add_argument("--output", type=Path, default=PROJECT_DIR / "BENCHMARKS.md", help="markdown file to update")
    parser.add_argument("--no-write", action="store_true", help="print the results only")
    parser.add_argument("--seed", type=int, default=20_240_101)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str], sizes: dict[str, tuple[Any, Any]]) -> argparse.Namespace:
    """Parse, and give each option of ``sizes`` left unset its (quick, full) default."""
    args = parser.parse_args(argv)
    for name, (quick, full) in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def command_line(script: str, argv: list[str]) -> str:
    python = Path(sys.executable)
    shown = python.relative_to(PROJECT_DIR) if python.is_relative_to(PROJECT_DIR) else python
    return shlex.join([str(shown), f"bench/{script}", *argv])  # run from the project folder


@contextmanager
def database(name: str, server: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """A new database ``name`` that Django is set up on and has migrated; yields its URL. ``env``
    is forced (the database too: the script drops it); DEBUG=false (dev's default DEBUG=True logs
    every query) and LOG_LEVEL=WARNING are defaults. Dropped at the end, also on error, Ctrl-C or SIGTERM."""
    # SIGTERM as an exit, so that the finally clauses stop the children and drop the database.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    server = server.rstrip("/")
    url = f"{server}/{name}"
    os.environ.update({"DJANGO_SETTINGS_MODULE": SETTINGS, "DATABASE_URL": url, **(env or {})})
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DEBUG", "false")
    import django
    import psycopg

    def on_server(*statements: str) -> None:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)

    on_server(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")
    try:
        django.setup()
        from django.core.management import call_command

        progress("migrate")
        call_command("migrate", verbosity=0)
        yield url
    finally:
        from django.apps import apps

        if apps.ready:
            from django.db import connections

            connections.close_all()
        on_server(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def child_env() -> dict[str, str]:
    """This process's environment for a child that imports the project."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_DIR), os.environ.get("PYTHONPATH")]))}


def machine(conn: Any) -> list[tuple[str, str]]:
    import django
    import psycopg
    from django.conf import settings

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    server_version = conn.execute("SHOW server_version").fetchone()[0]
    shared_buffers = conn.execute("SHOW shared_buffers").fetchone()[0]
    libpq = psycopg.pq.version()
    return [
        ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("nproc", f"{len(os.sched_getaffinity(0))} ({cpu})"),
        ("memory", f"{memory / 2**30:.1f} GiB"),
        ("os", platform.platform()),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("django", django.get_version()),
        ("psycopg", f"{psycopg.__version__} ({psycopg.pq.__impl__}, libpq {libpq // 10000}.{libpq % 10000})"),
        ("postgresql", f"{server_version} at {conn.info.host}:{conn.info.port}, shared_buffers {shared_buffers}"),
        ("settings", f"{os.environ['DJANGO_SETTINGS_MODULE']}, DEBUG={settings.DEBUG}"),
        ("LEAVE_CACHE_REWARM_AFTER", f"{settings.LEAVE_CACHE_REWARM_AFTER:,}"),
    ]


def gunicorn(children: Any, env: dict[str, str], workers: int | None = None) -> tuple[Any, str]:
    """gunicorn with deploy/gunicorn.conf.py (sync workers) on a free loopback port, answering;
    returns the child and its base URL. BIND and WEB_CONCURRENCY are what that file reads."""
    from support.client import Client
    from support.processes import free_port, wait_until

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**env, "BIND": f"127.0.0.1:{port}", **({"WEB_CONCURRENCY": str(workers)} if workers else {})}
    config = str(PROJECT_DIR / "deploy" / "gunicorn.conf.py")
    argv = [sys.executable, "-m", "gunicorn", "-c", config, "tidalproject.wsgi:application"]
    server = children.start("gunicorn", argv, env=env, cwd=PROJECT_DIR)

    def answers() -> bool:
        if not server.running:
            raise RuntimeError(f"gunicorn exited ({server.proc.returncode}):\n{server.tail()}")
        return Client(base, "").request("GET", "/api/signals/", timeout=2)[0] != 0  # 0: no answer; 401/405 is one

    wait_until(answers, timeout=60, what=f"gunicorn at {base}")
    return server, base


def json_answer(children: Any, child: Any, timeout: float) -> dict[str, Any]:
    """What a child prints last, one line of JSON, once it exits; it is stopped in any case."""
    try:
        code = child.wait(timeout=timeout)
    finally:
        children.stop(child)
    if code != 0:
        raise RuntimeError(f"{child.name} failed ({code}):\n{child.tail()}")
    return json.loads(child.output().strip().splitlines()[-1])


def finish(
    args: argparse.Namespace,
    script: str,
    argv: list[str],
    facts: Sequence[tuple[str, str]],
    found: report.Results,
    passed_text: str,
    markers: tuple[str, str],
    title: str = "",
) -> int:
    """Print what a report.Results ``found`` holds: its budgets and its rows for information, each a
    table, then its failed checks and the verdict; unless --no-write, put its markdown section between
    ``markers`` of --output (a ``title`` above the section puts its headings one level down). The exit status."""
    command = command_line(script, argv)
    verdict = "PASS" if found.passed else "FAIL"
    heading = "###" if title else "##"
    blocks = [title.strip()] if title else []
    blocks += [f"{heading} Results of the last run: {verdict}", f"```\n{command}\n```"]
    blocks.append("| Item | Value |\n|---|---|\n" + "\n".join(f"| {key} | {value} |" for key, value in facts))
    for name, rows in (("Budgets", found.budgets), ("For information", found.info)):
        if rows:
            print(f"\n{report.text_table(name.upper(), found.header, rows)}")
            blocks += [f"{heading}# {name}", report.markdown_table(found.header, rows)]
    checks = "\n".join(f"- FAILED: {what}" for what in found.failed_checks)
    blocks += [f"{heading}# Checks", checks or passed_text]
    for what in found.failed_checks:
        print(f"CHECK FAILED: {what}")
    print(f"\n{verdict}: {command}")
    if not args.no_write:
        report.write_section(args.output, "\n\n".join(blocks), start=markers[0], end=markers[1])
        print(f"results written to {args.output}")
    return 0 if found.passed else 1
