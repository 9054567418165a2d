"""A real, throw-away PostgreSQL server for the metadata tests and benchmarks.

``initdb`` into a temporary directory, ``pg_ctl start`` on a free TCP port of 127.0.0.1 (with
its Unix socket in that directory too), a fresh schema per engine.  PostgreSQL refuses to
run as root, so as root the server runs as the ``postgres`` user (Debian's package creates
it), which owns the directory.  Used by ``tests/meta/conftest.py`` and ``bench/meta_engines.py``
(both with ``tests/`` on ``sys.path``, for ``moto_server.free_port``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from moto_server import free_port

#: where Debian's postgresql package puts the server programs (newest first)
_SEARCH = ("/usr/lib/postgresql/*/bin",)


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl, or None (PostgreSQL is not installed)."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    found = sorted((Path(p) for pattern in _SEARCH for p in glob.glob(pattern)),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for d in reversed(found):
        if (d / "initdb").exists() and (d / "pg_ctl").exists():
            return d
    return None


class PgServer:
    """One running server; :meth:`url` names a database on it (created on first use)."""

    def __init__(self, bindir: Path, *, fsync: bool = True) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="tierd-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._user: str | None = None
        if os.geteuid() == 0:  # postgres will not run as root
            self._user = "postgres"
            pw = pwd.getpwnam(self._user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "tierd", "--auth=trust",
                  "--encoding=UTF8", "--no-instructions")
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                f"-c unix_socket_directories={self.root} -c max_connections=200 "
                f"-c fsync={'on' if fsync else 'off'}")
        self._opts = opts
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-o", opts, "start")
        self._made: set[str] = set()

    def _run(self, prog: str, *args: str) -> None:
        cmd = [str(self.bindir / prog), *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=self.root, timeout=120)
        if done.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"{prog} failed ({done.returncode}): {done.stdout}{done.stderr}"
                               f"{log[-2000:]}")

    def admin_url(self) -> str:
        return f"postgresql://tierd@127.0.0.1:{self.port}/postgres"

    def url(self, name: str) -> str:
        """An empty namespace for ``name`` (any string: a test's engine path), made the
        first time it is asked for: a schema of its own in one database, selected through
        ``search_path`` in the URL (a ``CREATE DATABASE`` costs ~0.3 s, too slow for the
        hundreds of engines a hypothesis test opens)."""
        schema = "s_" + hashlib.sha1(name.encode()).hexdigest()[:20]
        if schema not in self._made:
            import psycopg

            with psycopg.connect(self.admin_url(), autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            self._made.add(schema)
        return (f"postgresql://tierd@127.0.0.1:{self.port}/postgres"
                f"?options=-csearch_path%3D{schema}")

    def restart(self) -> None:
        """Stop (fast: every client connection is cut) and start again on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-m", "fast", "-o", self._opts, "restart")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
