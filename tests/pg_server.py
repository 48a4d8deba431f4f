"""A throwaway PostgreSQL server a test starts, kills with SIGKILL, restarts and stops.

`initdb` into a temporary folder and `postgres` on a free loopback port, from the
binaries of the machine's PostgreSQL (`/usr/lib/postgresql/*/bin`, or `pg_config
--bindir`). PostgreSQL refuses to run as root: when the tests run as root, the server
runs as the `postgres` user (or `HISTORIAN_TEST_PG_USER`). The server is its own process
group, so a kill takes the postmaster and every backend at once, as a crash would.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def find_bindir() -> Path | None:
    """The newest PostgreSQL's binary folder on this machine, if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        bindir = subprocess.run(
            ["pg_config", "--bindir"], check=True, capture_output=True, text=True
        ).stdout.strip()
        if (Path(bindir) / "initdb").exists():
            return Path(bindir)
    return None


def _version(path: str) -> tuple[int, ...]:
    part = Path(path).parent.parent.name
    return tuple(int(p) for p in part.split(".") if p.isdigit())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ThrowawayPostgres:
    """One PostgreSQL cluster in a temporary folder; `url` reaches its `postgres` database."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="historian-pg-"))
        self.data = self.folder / "data"
        self.process: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            user = pwd.getpwnam(os.environ.get("HISTORIAN_TEST_PG_USER", "postgres"))
            self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            **self._as,
        )

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server (its own process group) and wait until it accepts queries."""
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 - the server's stderr
        self.process = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.folder),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",  # a killed server keeps the OS's page cache: crash-safe enough
                "-c",
                "max_connections=40",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
            **self._as,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start: {self.log_tail()}")
            time.sleep(0.1)

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
            ) as conn:
                conn.execute("select 1")
        except psycopg.Error:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once (a crash), and reap them."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.process = None

    def log_tail(self) -> str:
        path = self.folder / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-5:])

    def remove(self) -> None:
        self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    """Does a process of the group still run (zombies, gone but not yet reaped, aside)?"""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


@contextlib.contextmanager
def throwaway_postgres(bindir: Path, attempts: int = 3) -> Iterator[ThrowawayPostgres]:
    """A started server, killed and removed on the way out whatever happened. Another
    process (tests run in parallel) may take the probed free port first: then a new port."""
    for attempt in range(1, attempts + 1):
        server = ThrowawayPostgres(bindir)
        try:
            server.init()
            server.start()
            break
        except RuntimeError:
            in_use = "already in use" in server.log_tail()
            server.remove()
            if not in_use or attempt == attempts:
                raise
    try:
        yield server
    finally:
        server.remove()


# Temporary tables over large temp_buffers: a backend drops each at exit, scanning every
# local buffer for each, before it releases its locks (PostgreSQL runs before_shmem_exit
# callbacks last-registered first: temporary relations, then ShutdownPostgres). About a
# second on a 2-core machine.
_SLOW_TO_END = (
    "SET temp_buffers = '8GB'; "
    "DO $$ BEGIN FOR i IN 1..250 LOOP "
    "EXECUTE format('CREATE TEMP TABLE slow_to_end_%s (a int)', i); END LOOP; "
    "INSERT INTO slow_to_end_1 VALUES (1); END $$"
)


class Sessions:
    """The connections an engine opens, to drop them all at once as a failover does: each
    is terminated (`pg_terminate_backend`, not waited for) and its socket shut, so the
    client learns at once. A session that took an advisory lock is made slow to end: it
    holds its locks about a second after its client learned it was gone, as on a loaded
    server."""

    def __init__(self, engine: Any) -> None:
        import sqlalchemy as sa

        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        sa.event.listen(engine, "checkout", self._used)
        sa.event.listen(engine, "after_cursor_execute", self._executed)

    def _used(self, dbapi_connection: Any, *args: Any) -> None:
        self._connections.add(dbapi_connection)

    def _executed(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "pg_try_advisory_lock" in statement:
            conn.connection.driver_connection.execute(_SLOW_TO_END)

    def drop(self, admin_url: str) -> int:
        """Terminate every open session and shut its socket; how many there were."""
        import psycopg

        alive: list[tuple[int, int]] = []  # (backend pid, socket) of each open session
        for connection in list(self._connections):
            with contextlib.suppress(psycopg.Error):
                alive.append((connection.info.backend_pid, connection.fileno()))
        with psycopg.connect(admin_url.replace("+psycopg", ""), autocommit=True) as admin:
            for pid, _ in alive:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _, fd in alive:
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        return len(alive)


def waiting_session(conn: Any, application: str, timeout_s: float = 15) -> int:
    """The backend of `application` once it waits on a lock (session locks held by `conn`,
    a SQLAlchemy connection, outlive its commits)."""
    import sqlalchemy as sa

    deadline = time.monotonic() + timeout_s
    while True:
        pid = conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :a "
                "AND wait_event_type = 'Lock'"
            ),
            {"a": application},
        ).scalar()
        conn.commit()  # the next look, a new snapshot of pg_stat_activity
        if pid is not None:
            return int(pid)
        assert time.monotonic() < deadline, f"{application} waits on a lock"
        time.sleep(0.02)
