"""A throwaway PostgreSQL server for the tests (the `postgres` session fixture of tests/conftest.py): a data folder
of its own in a temporary folder, listening on loopback at a free port (and on a unix socket in that folder), trust
authentication for one test role, `fsync=off` (nothing here must survive a crash of the machine; the server's locks
and transactions are unchanged by it). Each test that asks gets a fresh database on it (`new_database`).

initdb refuses to run as root: as root (the tests' containers), the server runs as a dedicated system user, created
when missing. The binaries come from the PATH, else Debian's `postgresql` package (/usr/lib/postgresql/*/bin:
.ci/run installs it on a fresh machine).
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

#: The system user the server runs as when the tests run as root.
SERVICE_USER = "dprelease-pg"
#: The server's superuser, which the tests connect as (trust authentication, loopback only).
ROLE = "dprelease"


def binaries() -> Path | None:
    """The folder of initdb, pg_ctl and postgres (one installation's), or None."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # a symlink on the PATH: pg_ctl and postgres are beside its target
    debian = [d for d in Path("/usr/lib/postgresql").glob("*/bin") if (d / "initdb").exists()]
    return max(debian, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if debian else None


class Server:
    """One running server; `stop` ends it and removes its folder."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.user = _service_user() if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix="dprelease-pg-"))
        if self.user:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = self.dir / "data"
        self.port = 0
        self._names = itertools.count()

    @classmethod
    def start(cls, bin_dir: Path) -> Server:
        server = cls(bin_dir)
        try:
            server._run("initdb", "-D", str(server.data), "-U", ROLE, "--auth=trust", "--encoding=UTF8",
                        "--locale=C", "--no-sync")
            server._listen()
        except BaseException:
            server.stop()
            raise
        return server

    def _listen(self) -> None:
        """Start on a free port (asked of the kernel; another process may take it before the server does: then
        once more)."""
        for attempt in range(3):
            self.port = _free_port()
            options = (f"-k {self.dir} -c listen_addresses=127.0.0.1 -p {self.port} -c fsync=off "
                       f"-c shared_buffers=16MB -c max_connections=50")
            try:
                self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w",
                          "-t", "60", "start")
                return
            except subprocess.CalledProcessError:
                if attempt == 2:
                    raise RuntimeError(f"the test PostgreSQL server did not start: "
                                       f"{(self.dir / 'log').read_text()[-2000:]}") from None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database on this server (~30 ms: a file copy of the template, fsync off; the
        WAL-logged copy, PostgreSQL 15's default, takes ~250 ms)."""
        name = f"ledger_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(f"CREATE DATABASE {name}{strategy}")
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self, mode: str = "immediate") -> None:
        """Stop the server, its data kept (a fault: the ledger's database goes away under running releases)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def resume(self) -> None:
        """Start a halted server again, on the same port."""
        options = (f"-k {self.dir} -c listen_addresses=127.0.0.1 -p {self.port} -c fsync=off "
                   f"-c shared_buffers=16MB -c max_connections=50")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "-t", "60",
                  "start")

    @property
    def pid(self) -> int | None:
        """The postmaster's process id (None when stopped)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _run(self, program: str, *args: str) -> None:
        user = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []} if self.user else {}
        subprocess.run([str(self.bin / program), *args], check=True, capture_output=True, cwd=self.dir,
                       env={**os.environ, "LC_ALL": "C"}, timeout=120, **user)


def _service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        # Another session may create it at the same moment: then useradd fails and the user exists all the same.
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVICE_USER],
                       capture_output=True)
        return pwd.getpwnam(SERVICE_USER)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

