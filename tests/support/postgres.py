"""A real PostgreSQL server (Debian's `postgresql` package) in a temporary directory, on a free loopback port.

`postgres` refuses to run as root, and CI runs as root: then the server runs as the unprivileged `postgres`
user the package creates (or `nobody`), through `runuser`, in a directory of its own under the system's
temporary directory (pytest's are private to root). Each test gets a fresh database of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support.processes import free_port

_DEFAULT_DSN_DB = "postgres"


def postgres_bin_dir() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not candidates:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql); scripts/test installs it")
    return candidates[-1].parent


def _unprivileged_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and neither user postgres nor nobody exists")


class PostgresServer:
    """A primary of its own, or (`standby_of`) a hot standby streaming from one, made by pg_basebackup."""

    def __init__(self, standby_of: PostgresServer | None = None) -> None:
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix="gpu-alert-bot-pg-"))
        self.data = workdir / "data"
        self.port = free_port()
        self._bin = postgres_bin_dir()
        self._user = _unprivileged_user()
        self._databases = itertools.count(1)
        if self._user is not None:
            shutil.chown(workdir, self._user)
        if standby_of is None:
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        else:
            # -R writes standby.signal and primary_conninfo: the copy starts as a hot standby of that primary.
            self._run(
                "pg_basebackup", "-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres",
                "-D", str(self.data), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast",
            )  # fmt: skip
        self.start()

    def replicate_synchronously(self) -> None:
        """Commit only once a standby has the commit (any standby, by its default application name)."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            conn.execute("SELECT pg_reload_conf()")

    def promote(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "promote")

    def kill(self) -> None:
        """SIGKILL the postmaster, as a machine that dies would leave it (its backends go with it)."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self._bin / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.workdir, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.workdir / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def dsn(self, database: str = _DEFAULT_DSN_DB) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def create_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        name = f"test_{next(self._databases)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.dsn(name)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.workdir, ignore_errors=True)


def store_section(directory: Path, dsn: str, replica: str, **options: object) -> dict[str, object]:
    """The bot's `store` section for a replica on the database `dsn`, read from a file in `directory`."""
    dsn_file = directory / "postgres_dsn"
    dsn_file.write_text(dsn + "\n")
    return {"backend": "postgresql", "dsn_file": str(dsn_file), "replica": replica, **options}
