"""A real cluster of tierd nodes on one machine, for the tests in ``tests/cluster/``.

One PostgreSQL server (:mod:`meta.pg_server`, a fresh *database* per cluster: the change
notifications of PostgreSQL are per database, so two clusters in two schemas of one database
would hear each other), one moto server over HTTP as the shared cold store, and N
``tierd serve`` subprocesses (:class:`durability.coldlib.Tierd`), each with its own data
directory, S3 and admin ports, FUSE mount and peer port, all with the same ``meta_url``,
the same ``cluster_secret`` and ``node_name`` n1, n2, ...

What every node of a cluster must share besides the database (docs/cluster.md): the cold
store, the root credentials (the environment) and ``cluster_secret``, from which each node
derives the key its S3 secrets are sealed with (tierd/acl/secrets.py), so a key made on one
node opens on every node.

"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from durability.coldlib import Cold, Tierd, wait_for
from meta.pg_server import PgServer
from moto_server import MotoServer, free_port

SECRET = "cluster-test-secret-0123456789abcdef"


class Node(Tierd):
    """One node: a :class:`Tierd` with a FUSE mount, the cluster's database and secret, its
    own name and peer port (kept across restarts, so its peer URL stays the same)."""

    def __init__(self, base: Path, cold: Cold, name: str, meta_url: str,
                 **settings: str) -> None:
        self.name = name
        self.peer_port = free_port()
        env = {"TIERD_META_URL": meta_url, "TIERD_NODE_NAME": name,
               "TIERD_PEER_LISTEN": f"127.0.0.1:{self.peer_port}",
               "TIERD_CLUSTER_SECRET": SECRET}
        super().__init__(base, cold, mount=True, **env, **settings)
        self.mnt: Path = base / "mnt"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart(self, timeout: float = 60.0) -> Node:
        """SIGTERM (if still running) and start again on the same data directory; the S3
        and admin ports change (ask :meth:`s3` again)."""
        self.stop()
        self.start(timeout)
        return self

    def path(self, bucket: str, key: str = "") -> Path:
        """``key`` of ``bucket`` through this node's FUSE mount."""
        return self.mnt / bucket / key if key else self.mnt / bucket


class Cluster:
    """The database, the cold store and the nodes (see the module docstring).

    ``settings`` are ``TIERD_*`` variables given to every node (e.g. ``TIERD_PERSIST_DELAY``).
    """

    def __init__(self, base: Path, pg: PgServer, moto: MotoServer, n: int = 3,
                 **settings: str) -> None:
        self.base, self.pg, self.moto = base, pg, moto
        self.db = f"c_{os.urandom(6).hex()}"
        self.meta_url = f"postgresql://tierd@127.0.0.1:{pg.port}/{self.db}"
        self.cold = Cold("s3", base, server=moto)
        self.nodes = [Node(base / f"n{i}", self.cold, f"n{i}", self.meta_url, **settings)
                      for i in range(1, n + 1)]

    def __getitem__(self, i: int) -> Node:
        """``cluster[1]`` is n1."""
        return self.nodes[i - 1]

    def start(self) -> Cluster:
        """Create the database, start the first node (it creates the tables) and then the
        others at once."""
        import psycopg

        with psycopg.connect(self.pg.admin_url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.db}")
        try:
            self.nodes[0].start(60)
            with ThreadPoolExecutor(len(self.nodes)) as ex:
                list(ex.map(lambda n: n.start(60), self.nodes[1:]))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (SIGTERM), waking a stalled database first."""
        self.pg_resume()
        with ThreadPoolExecutor(len(self.nodes)) as ex:
            list(ex.map(lambda n: n.stop(), self.nodes))

    # -- the database -----------------------------------------------------------------
    def _pg_pids(self) -> list[int]:
        """The postmaster and its children (every backend)."""
        pid = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        pids = [pid]
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                pids += [int(p) for p in (task / "children").read_text().split()]
        return pids

    def pg_restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the server comes back on the
        same port."""
        self.pg.restart()

    def pg_stall(self) -> None:
        """SIGSTOP the server (postmaster and backends): connections stay open and nothing
        answers, as a network stall."""
        for pid in self._pg_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self._stalled = True

    def pg_resume(self) -> None:
        """SIGCONT what :meth:`pg_stall` stopped."""
        if not getattr(self, "_stalled", False):
            return
        for pid in self._pg_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._stalled = False

    def logs(self) -> str:
        """The end of every node's log, for assertion messages."""
        return "\n".join(f"--- {n.name}\n{n.log[-3000:]}" for n in self.nodes)


@contextlib.contextmanager
def running_cluster(base: Path, pg: PgServer, moto: MotoServer, n: int = 3,
                    **settings: str) -> Iterator[Cluster]:
    """A started :class:`Cluster`, stopped at exit."""
    cluster = Cluster(base, pg, moto, n, **settings).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def poll(what: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> float:
    """Call ``what`` until it returns a true value; the seconds that took (AssertionError
    after ``timeout``)."""
    t0 = time.monotonic()
    wait_for(lambda: bool(what()), timeout, getattr(what, "__name__", "condition"), every)
    return time.monotonic() - t0


@contextlib.contextmanager
def feeds_stalled(cluster: Cluster) -> Iterator[list[int]]:
    """SIGSTOP the PostgreSQL backends of every node's change feed (the sessions that
    ``LISTEN``, tierd.meta.pg_changes) for the block, as a stall of those connections
    alone: no node hears another's commits, while every other query is answered.  Yields
    the stopped backends' pids."""
    import psycopg

    with psycopg.connect(cluster.pg.admin_url(), autocommit=True) as conn:
        pids = [int(r[0]) for r in conn.execute(  # a feed's last query is one of these two
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND (query = "
            "'LISTEN tierd_changes' OR query LIKE 'SELECT seq, node, keys FROM kv_log%%')",
            (cluster.db,))]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
