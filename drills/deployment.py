"""A real deployment on loopback for the drills: a PostgreSQL database and Redis databases of its own, gunicorn,
Celery workers and beat under the production settings, started from deploy/systemd's units; all stopped after."""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import redis

from support.client import Client
from support.processes import Supervisor, free_port, wait_until

PROJECT_DIR = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
PG_SERVER = "postgres://127.0.0.1:5432"
REDIS_SERVER = "redis://127.0.0.1:6379"


def unit_command(unit: str, *, instance: str = "") -> list[str]:
    """A deploy/systemd unit's ExecStart, its installed program replaced by this interpreter's module of that name."""
    text = (PROJECT_DIR / "deploy" / "systemd" / unit).read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("%i", instance).replace("%H", "%h"))
    return [PYTHON, "-m", Path(argv[0]).name, *argv[1:]]


class Deployment(Supervisor):
    celery_workers = 2

    def __init__(self, *, name: str, broker_db: int, pooled: bool = False) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = f"{PG_SERVER}/{name}"  # the drills' own checks read it directly
        self.broker_url = f"{REDIS_SERVER}/{broker_db}"
        # With ``pooled``, web and workers reach PostgreSQL through a PgBouncer in transaction mode.
        self.pooler = Path(tempfile.mkdtemp(prefix="tidal-pgbouncer-")) if pooled else None
        self.pooler_port = free_port()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tidalproject.settings.production",
            "SECRET_KEY": secrets.token_urlsafe(64),
            "DATABASE_URL": f"postgres://127.0.0.1:{self.pooler_port}/{name}" if pooled else self.database_url,
            "DATABASE_DISABLE_SERVER_SIDE_CURSORS": str(pooled).lower(),
            "CELERY_BROKER_URL": self.broker_url,
            "CACHE_URL": f"{REDIS_SERVER}/{broker_db + 1}",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "false",  # plain HTTP on loopback
            "BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": "2",
            "SIGNAL_SWEEP_AFTER_SECONDS": "5",
            "SIGNAL_SWEEP_EVERY_SECONDS": "2",
            "THROTTLE_WRITE_RATE": "100000/minute",
            "THROTTLE_SERVICE_WRITE_RATE": "1000000/minute",
            # The lockout, not the log-in throttle, is what auth_attacks tries; and as behind a
            # proxy that sets X-Real-IP, so that one machine can play clients at many addresses.
            "THROTTLE_LOGIN_RATE": "100000/minute",
            "CLIENT_IP_HEADER": "X-Real-IP",
            "CONN_MAX_AGE": "0",
            # Webhook receivers in the drills listen on loopback; retries and leases are short.
            "WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
            "WEBHOOK_TIMEOUT_SECONDS": "2",
            "WEBHOOK_RETRY_BASE_SECONDS": "0.5",
            "WEBHOOK_RETRY_MAX_SECONDS": "4",
            "WEBHOOK_SWEEP_EVERY_SECONDS": "2",
            "PYTHONPATH": str(PROJECT_DIR),
        }
        super().__init__(env=env, cwd=PROJECT_DIR, logs=PROJECT_DIR / "var" / "drills" / name)
        self.token = ""

    def __enter__(self) -> Deployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.pooler is not None:
            self._start_pooler(self.pooler)
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        redis.Redis.from_url(self.broker_url).flushdb()
        redis.Redis.from_url(self.env["CACHE_URL"]).flushdb()
        self.manage("migrate", "--noinput")
        self.token = self.service_client("drill-service").token
        self.run("web", unit_command("tidal-web.service"))
        for index in range(self.celery_workers):
            self.start_worker(f"worker{index}")
        schedule = f"--schedule={self.logs / 'celerybeat-schedule'}"
        self.run("beat", [schedule if a.startswith("--schedule=") else a for a in unit_command("tidal-beat.service")])
        what = f"the web server (see {self.logs}/web.log)"
        wait_until(lambda: self.client().request("GET", "/api/schema/", timeout=5)[0] == 200, timeout=60, what=what)
        self.watch()

    def _start_pooler(self, folder: Path) -> None:
        """Debian's PgBouncer in transaction mode on loopback, configured in ``folder``. It refuses to run
        as root, so as root it runs as the postgres user (hence a folder anyone can read)."""
        (folder / "users.txt").write_text(f'"{os.environ.get("USER") or "root"}" ""\n')
        # psycopg and Django send extra_float_digits and options: PgBouncer must not refuse them.
        (folder / "pgbouncer.ini").write_text(f"""[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.pooler_port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
""")
        folder.chmod(0o777)
        for path in folder.iterdir():
            path.chmod(0o666)
        pgbouncer = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        as_postgres = ["-u", "postgres"] if os.geteuid() == 0 else []
        self.run("pgbouncer", [pgbouncer, *as_postgres, str(folder / "pgbouncer.ini")])
        what = f"pgbouncer (see {self.logs}/pgbouncer.log)"  # it logs "process up" once it listens
        wait_until(lambda: "LOG process up" in self.log_since_start("pgbouncer"), timeout=15, what=what)

    def stop(self) -> None:
        self.stop_all()
        if self.pooler is not None:
            shutil.rmtree(self.pooler, ignore_errors=True)
        with contextlib.suppress(psycopg.Error), psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')  # unless a drill stopped the server

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=PROJECT_DIR, env=self.env, capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start_worker(self, name: str) -> None:
        self.run(name, unit_command("tidal-worker@.service", instance=name.removeprefix("worker")))

    @contextlib.contextmanager
    def workers_paused(self) -> Iterator[None]:
        """The Celery workers SIGSTOPped (they keep their state and take no work) until the block ends."""
        for name in self.workers():
            self.pause(name)
        try:
            yield
        finally:
            for name in self.workers():
                self.resume(name)

    def crash(self, name: str, *, down: float = 0.5) -> None:
        """kill -9 the worker ``name`` (parent and children), and start it again ``down`` seconds later."""
        self.kill(name)
        time.sleep(down)
        self.start_worker(name)

    def client(self, token: str | None = None) -> Client:
        """A client of the web server, with the service account's token unless given another."""
        return Client(self.url, self.token if token is None else token)

    def service_client(self, name: str, *perms: str) -> Client:
        """A client with the token of a new service account ``name`` that has ``perms``."""
        printed = self.manage("create_service_account", name, *(a for perm in perms for a in ("--perm", perm)))
        return self.client(printed.strip().splitlines()[-1])

    def clock(self) -> int:
        """The leave clock's version."""
        return int(self.sql("SELECT version FROM community_leaveclock WHERE id = 1")[0][0])

    def workers(self) -> list[str]:
        return [name for name in self.children if name.startswith("worker")]

    def mid_task(self, worker: str, task: str = "") -> bool:
        """Whether the worker's log shows a task (named ``task``, or any) taken and not finished or retried."""
        log = [line for line in self.log_since_start(worker).splitlines() if task in line]
        finished = sum("] succeeded in" in line or "] retry:" in line for line in log)
        return sum("] received" in line for line in log) > finished

    def verify_stop_forward(self) -> tuple[bool, str]:
        """``manage.py verify_stop_forward`` on the deployment's data: (passed, what it said)."""
        argv = [PYTHON, "manage.py", "verify_stop_forward", "--no-progress"]
        done = subprocess.run(argv, cwd=PROJECT_DIR, env=self.env, capture_output=True, text=True, timeout=600)
        said = (done.stdout.strip().splitlines() or [""])[-1]
        named = [line for line in done.stderr.splitlines() if line.startswith("counterexample")]
        return done.returncode == 0, "; ".join([said, *named[:5]])

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.database_url) as conn:
            return conn.execute(query, params).fetchall()


REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", ""]
REDIS_START += ["--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]


def stop_redis() -> None:
    """Stop the machine's Redis server (the drills' broker), keeping nothing."""
    subprocess.run(["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30, check=False)


def start_redis() -> None:
    subprocess.run(REDIS_START, capture_output=True, timeout=30, check=True)
    wait_until(_redis_answers, timeout=30, interval=0.2, what="redis to come back")


def _redis_answers() -> bool:
    with contextlib.suppress(redis.ConnectionError):
        return bool(redis.Redis.from_url(REDIS_SERVER).ping())
    return False


def postgres_ctl(action: str) -> None:
    """start, stop or restart the machine's PostgreSQL cluster."""
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    argv = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action]
    subprocess.run(argv, capture_output=True, timeout=120, check=True)
