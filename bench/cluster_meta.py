"""Metadata operations per second through FUSE mounts: 8 clients spread over the three nodes
of a cluster (one PostgreSQL database) against the same 8 clients on one node with the
embedded lmdb store.

The test cluster of tests/cluster/clusterlib.py (one PostgreSQL server with fsync on, one
moto server as the cold store, three ``tierd serve``) and, in the same run, one ``tierd
serve`` on lmdb (tests/durability/coldlib.py) over the same cold store.  Each client is a
thread making ``--files`` files in a directory of its own through its node's mount, then
stats, renames and unlinks them: create (open O_CREAT|O_EXCL + close), stat, rename, unlink,
each phase timed from the first client's start to the last one's end.  Write-back is held
back (the files are empty anyway).  The daemons run with tierd's default ``import_ttl``
(5 s); ``--import-ttl 0``, the test harness's setting, makes every look-up of a new name
list the cold store (a request to moto per create and per rename: most of the CPU the
runs before 2026-11-26 measured).  ``--cpu`` adds each phase's CPU per operation of every
process, ``--statements`` the database's statements per operation, ``--profile`` py-spy
of every node's running threads during the creates; ``--spy`` samples every node during
the creates on 3 nodes and reports where its event loop's thread was (idle, waiting in a
query of a transaction body, running, and in what).  Prints one JSON document; ``--out
FILE`` writes it there too.  ``--juicefs`` adds JuiceFS in the same run
(bench/juicefs_peer.py): one volume on a database of the same PostgreSQL server, mounted
three times as three nodes would, then the same workloads (``juicefs_3_mounts``,
``juicefs_1_mount``).

    .venv/bin/python bench/cluster_meta.py --clients 8 --files 200 \\
        --out bench/results/cluster_meta.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the cluster harness and its servers

from benchlib import idle_state, stop_mounted  # noqa: E402
from cluster.clusterlib import running_cluster  # noqa: E402
from durability.coldlib import Cold, Tierd, running  # noqa: E402
from juicefs_peer import juicefs_version, start_juicefs  # noqa: E402
from meta.pg_server import PgServer, find_bindir  # noqa: E402
from moto_server import running_moto  # noqa: E402

PHASES = ("create", "stat", "rename", "unlink")
SETTINGS = {"TIERD_PERSIST_DELAY": "600", "TIERD_LOG_LEVEL": "warning"}


def _phase(dirs: list[Path], files: int, op: Callable[[Path, int], None]) -> float:
    """Run ``op(dir, i)`` for every file of every client, one thread per client; ops/s."""
    barrier = threading.Barrier(len(dirs))
    errors: list[BaseException] = []

    def client(d: Path) -> None:
        barrier.wait()
        try:
            for i in range(files):
                op(d, i)
        except BaseException as e:  # reported after the phase
            errors.append(e)

    threads = [threading.Thread(target=client, args=(d,)) for d in dirs]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"a client failed: {errors[0]!r}")
    return len(dirs) * files / took


def _create(d: Path, i: int) -> None:
    os.close(os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))


def _stat(d: Path, i: int) -> None:
    os.stat(d / f"f{i}")


def _rename(d: Path, i: int) -> None:
    os.rename(d / f"f{i}", d / f"g{i}")


def _unlink(d: Path, i: int) -> None:
    os.unlink(d / f"g{i}")


def _ticks(pid: int) -> int:
    """utime + stime of a process (all its threads), in clock ticks; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # (fields 14 and 15 of proc(5))


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return out


class CpuMeter:
    """CPU time of the processes of a run, per phase: each daemon, PostgreSQL (the
    postmaster and its backends, found again at each reading: a backend that exited
    meanwhile is not counted), moto and this bench (its client threads)."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups
        self.hz = os.sysconf("SC_CLK_TCK")

    def read(self) -> dict[str, dict[int, int]]:
        return {name: {p: _ticks(p) for p in pids()} for name, pids in self.groups.items()}

    def spent(self, before: dict[str, dict[int, int]], ops: int) -> dict[str, float]:
        """Milliseconds of CPU per operation since ``before``, per group."""
        now = self.read()
        out = {}
        for name, ticks in now.items():
            old = before.get(name, {})
            t = sum(v - old.get(p, 0) for p, v in ticks.items())
            out[name] = round(t / self.hz * 1000 / ops, 2)
        out["total"] = round(sum(out.values()), 2)
        return out


def _fixed(pid: int) -> Callable[[], list[int]]:
    return lambda: [pid]


def _pids(proc: subprocess.Popen[bytes] | None) -> Callable[[], list[int]]:
    """A process's pid as a :class:`CpuMeter` group (none when it is not running)."""
    return lambda: [proc.pid] if proc is not None else []


class LockMeter:
    """How busy the cluster's writer lock was during a phase: a thread samples the server's
    ``pg_stat_activity`` every 10 ms (one query on a connection of its own) and the
    machine's ``/proc/stat``.  A tierd write transaction is given a transaction id when it
    takes the lock (``SELECT ... FOR UPDATE``) and reads take none, so a sample with a
    backend holding an id is one where a writer held the lock; a backend waiting on a lock
    is a writer of another node queued for it.  Shares of samples: ``writer_held``,
    ``waiting`` (at least one waiter), ``waiters`` (their mean count), and ``cpu_idle``
    (the machine's idle and iowait time between samples); and of the samples where the
    lock was held, what its holder did: ``holder_client`` (idle in its transaction: the
    writer's own process has the turn), ``holder_io`` (the server writing or flushing,
    mostly the commit's WAL flush), ``holder_running`` (the server running a statement)."""

    _QUERY = ("SELECT count(*) FILTER (WHERE state LIKE 'idle in%'), "
              "count(*) FILTER (WHERE state NOT LIKE 'idle%' AND wait_event_type = 'IO'), "
              "count(*) FILTER (WHERE state NOT LIKE 'idle%' AND wait_event_type IS "
              "DISTINCT FROM 'IO'), "
              "(SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock') "
              "FROM pg_stat_activity WHERE backend_xid IS NOT NULL "
              "AND wait_event_type IS DISTINCT FROM 'Lock' AND pid <> pg_backend_pid()")

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self._stop = threading.Event()
        self._rows: list[tuple[int, int, int, int, float]] = []
        self._thread: threading.Thread | None = None

    @staticmethod
    def _cpu() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]

    def _run(self) -> None:
        last = self._cpu()
        while True:  # (a sample at once: even a phase of a few ms has one)
            row = self.conn.execute(self._QUERY).fetchone()
            now = self._cpu()
            total, idle = now[0] - last[0], now[1] - last[1]
            last = now
            if row is not None:
                client, io, running, waiters = (int(x) for x in row[:4])
                self._rows.append((client, io, running, waiters,
                                   idle / total if total else 0.0))
            if self._stop.wait(0.01):
                return

    def start(self) -> None:
        self._rows, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        rows, n = self._rows, max(1, len(self._rows))
        held = [r for r in rows if r[0] + r[1] + r[2]]
        h = max(1, len(held))
        return {"samples": len(rows),
                "writer_held": round(len(held) / n, 3),
                "waiting": round(sum(1 for r in rows if r[3]) / n, 3),
                "waiters": round(sum(r[3] for r in rows) / n, 2),
                "cpu_idle": round(sum(r[4] for r in rows) / n, 3),
                "holder_client": round(sum(1 for r in held if r[0]) / h, 3),
                "holder_io": round(sum(1 for r in held if r[1]) / h, 3),
                "holder_running": round(sum(1 for r in held if r[2]) / h, 3)}


class Statements:
    """The statements the server ran per operation of a phase (``pg_stat_statements``,
    loaded at the server's start by ``--statements``): calls per operation of each and
    its mean time in the server (ms), the top 12, and all statements together."""

    def __init__(self, url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def per_op(self, ops: int) -> dict[str, Any]:
        rows = self.conn.execute(
            "SELECT calls, total_exec_time, query FROM pg_stat_statements "
            "WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC").fetchall()
        return {"all": round(sum(r[0] for r in rows) / ops, 2),
                "exec_ms": round(sum(r[1] for r in rows) / ops, 3),
                "top": [[round(c / ops, 2), round(t / c, 3) if c else 0.0,
                         " ".join(q.split())[:100]] for c, t, q in rows[:12]]}


def _workload(mounts: list[Path], clients: int, files: int, tag: str,
              spy: list[int] | None = None, cpu: CpuMeter | None = None,
              profile: bool = False, stmts: Statements | None = None,
              lock: LockMeter | None = None) -> dict[str, Any]:
    """The four phases with ``clients`` clients, client k on ``mounts[k % len(mounts)]``;
    with ``spy`` (daemons' pids) py-spy samples those daemons during the creates (only
    their running threads with ``profile``); with
    ``cpu`` each phase's CPU per operation of each process group (ms); with ``lock`` how
    busy the writer lock was (:class:`LockMeter`)."""
    dirs = []
    for k in range(clients):
        d = mounts[k % len(mounts)] / "bench" / f"{tag}-c{k}"
        d.mkdir(parents=True)
        dirs.append(d)
    ops = (_create, _stat, _rename, _unlink)
    out: dict[str, Any] = {}
    for name, op in zip(PHASES, ops, strict=True):
        if stmts is not None:
            stmts.reset()
        before = cpu.read() if cpu is not None else {}
        if lock is not None:
            lock.start()
        began = time.time()
        if spy and name == "create":
            with contextlib.ExitStack() as stack:
                wheres = [stack.enter_context(_spying(pid, not profile)) for pid in spy]
                before = cpu.read() if cpu is not None else {}
                out[name] = round(_phase(dirs, files, op), 1)
            out["create_loop"] = wheres
        else:
            out[name] = round(_phase(dirs, files, op), 1)
        out[f"{name}_wall"] = [round(began, 2), round(time.time(), 2)]  # (to match logs)
        if lock is not None:
            out[f"{name}_lock"] = lock.stop()
        if cpu is not None:
            out[f"{name}_cpu_ms"] = cpu.spent(before, clients * files)
        if stmts is not None:
            out[f"{name}_statements"] = stmts.per_op(clients * files)
    return out


@contextlib.contextmanager
def _spying(pid: int, idle: bool = True) -> Iterator[dict[str, Any]]:
    """py-spy on ``pid`` meanwhile; then where its event loop's thread was, in shares of its
    samples: idle (waiting for events), in a transaction body's query (``PgTxn._query``:
    a get or scan the cache did not answer, on the loop), running anything else; and the
    tierd callers of those queries.  With ``idle`` False (``--profile``): only samples of
    threads running (or waiting in a system call), every thread, by function
    (:func:`_cpu_shares`)."""
    where: dict[str, Any] = {}
    spy = REPO / ".venv" / "bin" / "py-spy"
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as raw:
        proc = subprocess.Popen([str(spy), "record", "--format", "raw", "--threads",
                                 *(["--idle"] if idle else []), "--nonblocking",
                                 "--rate", "200" if idle else "50", "--pid", str(pid),
                                 "-o", raw.name], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # (py-spy attaches)
        try:
            yield where
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        text = Path(raw.name).read_text()
        where.update(_loop_shares(text) if idle else _cpu_shares(text))
        where["raw"] = raw.name  # (kept: py-spy's stacks, for a closer look)


def _names(frames: list[str]) -> set[str]:
    """py-spy's frames ("func (path/file.py:line)") as "func file.py", each once."""
    return {f.split(" (")[0] + " " + f.split(" (")[-1].split(":")[0].split("/")[-1]
            for f in frames}


def _loop_shares(raw: str) -> dict[str, Any]:
    """See :func:`_spying` (the daemon runs its loop on its main thread)."""
    total = idle = query = 0
    callers: dict[str, int] = {}
    running: dict[str, int] = {}  # function -> samples of the loop running inside it
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if ": MainThread;" not in stack or not count.isdigit():  # (the loop's thread)
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if any(f.startswith("PgTxn._query (") for f in frames):  # (psycopg waits in epoll)
            query += n
            mine = [f for f in frames if "tierd/" in f and "tierd/meta/" not in f]
            key = mine[-1].split(" (")[0] if mine else "?"
            callers[key] = callers.get(key, 0) + n
        elif "(selectors.py" in frames[-1]:
            idle += n
        else:
            for f in _names(frames[1:]):
                running[f] = running.get(f, 0) + n
    if not total:
        return {"samples": 0}
    top = sorted(callers.items(), key=lambda kv: -kv[1])[:8]
    return {"samples": total, "idle": round(idle / total, 3),
            "body_query": round(query / total, 3),
            "query_callers": {k: round(v / total, 3) for k, v in top},
            "running_in": {k: round(v / total, 3) for k, v in
                           sorted(running.items(), key=lambda kv: -kv[1])[:40]}}


def _cpu_shares(raw: str) -> dict[str, Any]:
    """Of the samples of running threads: the share of each thread (by its name, numbers
    dropped), and of each function anywhere on the stack (inclusive), the top 50."""
    total = 0
    threads: dict[str, int] = {}
    funcs: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        name = frames[0].split(": ")[-1].rstrip("0123456789_")
        threads[name] = threads.get(name, 0) + n
        for f in _names(frames[1:]):
            funcs[f] = funcs.get(f, 0) + n
    if not total:
        return {"samples": 0}
    return {"samples": total,
            "threads": {k: round(v / total, 3) for k, v in
                        sorted(threads.items(), key=lambda kv: -kv[1])},
            "functions": {k: round(v / total, 3) for k, v in
                          sorted(funcs.items(), key=lambda kv: -kv[1])[:50]}}


def _juicefs_runs(pg: PgServer, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The workloads on JuiceFS: one volume on a fresh database of ``pg``, three mounts."""
    import psycopg

    with psycopg.connect(pg.admin_url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE jfs")
    url = f"postgres://host=127.0.0.1 port={pg.port} user=tierd dbname=jfs sslmode=disable"
    mounts: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        bucket = None
        for i in range(3):
            proc, bucket, mnt, _ = start_juicefs(base / f"m{i + 1}", url, bucket)
            mounts.append((proc, mnt))
        (mounts[0][1] / "bench").mkdir()
        paths = [m for _, m in mounts]
        return {"juicefs_3_mounts": _workload(paths, args.clients, args.files, "j"),
                "juicefs_1_mount": _workload(paths[:1], args.clients, args.files, "j1")}
    finally:
        for proc, mnt in mounts:
            stop_mounted(proc, mnt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--files", type=int, default=200, help="files per client")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--spy", action="store_true",
                    help="py-spy every node during the creates on 3 nodes: where its loop "
                    "waits and what it runs (needs .venv/bin/py-spy and ptrace rights)")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy every node during the creates on 3 nodes, running threads "
                    "only (50 Hz): which threads and functions the daemon's CPU goes to")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU per operation of each daemon, PostgreSQL, moto and the "
                    "clients, per phase (ms, from /proc/PID/stat)")
    ap.add_argument("--import-ttl", default="5",
                    help="the daemons' import_ttl (seconds; default tierd's own; 0, the "
                    "test harness's and this bench's before 2026-11-26, lists cold at "
                    "every look-up of a name a directory lacks)")
    ap.add_argument("--persist-delay", default="600",
                    help="the daemons' persist_delay (seconds; default: write-back held back "
                    "past the run; tierd's own is 5, which uploads every file meanwhile)")
    ap.add_argument("--statements", action="store_true",
                    help="the database statements per operation (pg_stat_statements)")
    ap.add_argument("--lock", action="store_true",
                    help="how busy the cluster's writer lock was in each phase, and the "
                    "machine's idle CPU (pg_stat_activity and /proc/stat every 10 ms)")
    ap.add_argument("--skip-lmdb", action="store_true", help="only the PostgreSQL runs")
    ap.add_argument("--juicefs", action="store_true",
                    help="also JuiceFS over the same PostgreSQL, three mounts of one volume "
                    "(pip install juicefs)")
    args = ap.parse_args()
    SETTINGS["TIERD_IMPORT_TTL"] = args.import_ttl
    SETTINGS["TIERD_PERSIST_DELAY"] = args.persist_delay
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (./dev.sh setup installs it)")
    pg = PgServer(bindir, fsync=True)
    if args.statements:
        pg._opts += " -c shared_preload_libraries=pg_stat_statements"
        pg.restart()
    result: dict[str, Any] = {
        "bench": "cluster_meta", "clients": args.clients, "files_per_client": args.files,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m_start": os.getloadavg()[0], **idle_state()},
    }
    try:
        with running_moto() as moto, tempfile.TemporaryDirectory(prefix="tierd-bench-") as base:
            moto.client().create_bucket(Bucket="tierd-cold")
            cold = Cold("s3", Path(base), server=moto)
            single = Tierd(Path(base) / "single", cold, mount=True, **SETTINGS)
            mine = os.getpid()
            if not args.skip_lmdb:
                with running(single):
                    assert single.mnt is not None and single.proc is not None
                    (single.mnt / "bench").mkdir()
                    cpu = CpuMeter({"daemon": _pids(single.proc), "moto": _pids(moto._proc),
                                    "clients": lambda: [mine]}) if args.cpu else None
                    result["lmdb_1_node"] = _workload([single.mnt], args.clients, args.files,
                                                      "l", cpu=cpu)
            with running_cluster(Path(base) / "cluster", pg, moto, 3, **SETTINGS) as cluster:
                (cluster[1].mnt / "bench").mkdir()
                mounts = [n.mnt for n in cluster.nodes]
                daemons = [n.proc.pid for n in cluster.nodes if n.proc is not None]
                cpu = None
                if args.cpu:
                    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
                    groups: dict[str, Callable[[], list[int]]] = {
                        f"n{i + 1}": _fixed(p) for i, p in enumerate(daemons)}
                    groups.update(postgres=lambda: [postmaster, *_children(postmaster)],
                                  moto=_pids(moto._proc), clients=lambda: [mine])
                    cpu = CpuMeter(groups)
                spy = daemons if args.spy or args.profile else None
                stmts = Statements(cluster.meta_url) if args.statements else None
                lock = LockMeter(cluster.meta_url) if args.lock else None
                result["pg_3_nodes"] = _workload(mounts, args.clients, args.files, "p", spy,
                                                 cpu, args.profile, stmts, lock)
                result["pg_1_node"] = _workload(mounts[:1], args.clients, args.files, "p1",
                                                cpu=cpu, stmts=stmts, lock=lock)
            if args.juicefs:
                result["juicefs"] = juicefs_version()
                result.update(_juicefs_runs(pg, Path(base) / "juicefs", args))
    finally:
        pg.stop()
    result["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
