"""A real PgBouncer in transaction mode on loopback, for the drills (Debian's package).

Started with a configuration of its own in a temporary folder, on a free port, in front of
the machine's PostgreSQL; stopped and removed with it. PgBouncer refuses to run as root, so
as root it runs as the postgres user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path

from support.processes import Child, free_port, wait_until

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """``with PgBouncer(server_port=5432) as pool: pool.url(database)``."""

    def __init__(self, *, server_host: str = "127.0.0.1", server_port: int = 5432, pool_size: int = 20) -> None:
        self.server_host, self.server_port, self.pool_size = server_host, server_port, pool_size
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="tidal-pgbouncer-"))
        self.child: Child | None = None

    def url(self, database: str) -> str:
        return f"postgres://127.0.0.1:{self.port}/{database}"

    def __enter__(self) -> PgBouncer:
        user = os.environ.get("USER") or "root"
        (self.folder / "users.txt").write_text(f'"{user}" ""\n')
        # psycopg and Django send extra_float_digits and options: PgBouncer must not refuse them.
        (self.folder / "pgbouncer.ini").write_text(f"""[databases]
* = host={self.server_host} port={self.server_port}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.folder / "users.txt"}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits,options
""")
        self.folder.chmod(0o777)
        for path in self.folder.iterdir():
            path.chmod(0o666)
        argv = [PGBOUNCER, str(self.folder / "pgbouncer.ini")]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", "postgres"]
        self.child = child = Child("pgbouncer", argv, env=dict(os.environ), cwd=self.folder)
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: self._answers() or not child.running, timeout=15, what="pgbouncer")
        if not self._answers():
            self.__exit__()
            raise RuntimeError(f"pgbouncer did not start on port {self.port}:\n{child.tail()}")
        return self

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
            return True
        return False

    def __exit__(self, *exc: object) -> None:
        if self.child is not None:
            self.child.stop(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)
