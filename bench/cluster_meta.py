"""Metadata operations per second through FUSE mounts: 8 clients spread over the three nodes
of a cluster (one PostgreSQL database) against the same 8 clients on one node with the
embedded lmdb store.

The test cluster of tests/cluster/clusterlib.py (one PostgreSQL server with fsync on, one
moto server as the cold store, three ``tierd serve``) and, in the same run, one ``tierd
serve`` on lmdb (tests/durability/coldlib.py) over the same cold store.  Each client is a
thread making ``--files`` files in a directory of its own through its node's mount, then
stats, renames and unlinks them: create (open O_CREAT|O_EXCL + close), stat, rename, unlink,
each phase timed from the first client's start to the last one's end.  Write-back is held
back (the files are empty anyway).  ``--spy`` samples the first node with py-spy during the
creates on 3 nodes and reports where its event loop's thread was (idle, waiting in a query
of a transaction body, running).  Prints one JSON document; ``--out FILE`` writes it there
too.

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

from cluster.clusterlib import running_cluster  # noqa: E402
from durability.coldlib import Cold, Tierd, running  # noqa: E402
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


def _workload(mounts: list[Path], clients: int, files: int, tag: str,
              spy: int | None = None) -> dict[str, Any]:
    """The four phases with ``clients`` clients, client k on ``mounts[k % len(mounts)]``;
    with ``spy`` (a daemon's pid) py-spy samples that daemon during the creates."""
    dirs = []
    for k in range(clients):
        d = mounts[k % len(mounts)] / "bench" / f"{tag}-c{k}"
        d.mkdir(parents=True)
        dirs.append(d)
    ops = (_create, _stat, _rename, _unlink)
    out: dict[str, Any] = {}
    for name, op in zip(PHASES, ops, strict=True):
        if spy is not None and name == "create":
            with _spying(spy) as where:
                out[name] = round(_phase(dirs, files, op), 1)
            out["create_loop"] = where
            continue
        out[name] = round(_phase(dirs, files, op), 1)
    return out


@contextlib.contextmanager
def _spying(pid: int) -> Iterator[dict[str, Any]]:
    """py-spy on ``pid`` meanwhile; then where its event loop's thread was, in shares of its
    samples: idle (waiting for events), in a transaction body's query (``PgTxn._query``:
    a get or scan the cache did not answer, on the loop), running anything else; and the
    tierd callers of those queries."""
    where: dict[str, Any] = {}
    spy = REPO / ".venv" / "bin" / "py-spy"
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as raw:
        proc = subprocess.Popen([str(spy), "record", "--format", "raw", "--threads", "--idle",
                                 "--nonblocking", "--rate", "200", "--pid", str(pid),
                                 "-o", raw.name], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # (py-spy attaches)
        try:
            yield where
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        where.update(_loop_shares(Path(raw.name).read_text()))
        where["raw"] = raw.name  # (kept: py-spy's stacks, for a closer look)


def _loop_shares(raw: str) -> dict[str, Any]:
    """See :func:`_spying` (the daemon runs its loop on its main thread)."""
    total = idle = query = 0
    callers: dict[str, int] = {}
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
    if not total:
        return {"samples": 0}
    top = sorted(callers.items(), key=lambda kv: -kv[1])[:8]
    return {"samples": total, "idle": round(idle / total, 3),
            "body_query": round(query / total, 3),
            "query_callers": {k: round(v / total, 3) for k, v in top}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--files", type=int, default=200, help="files per client")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--spy", action="store_true",
                    help="py-spy the first node during the creates on 3 nodes: where its loop "
                    "waits (needs .venv/bin/py-spy and ptrace rights)")
    args = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (./dev.sh setup installs it)")
    pg = PgServer(bindir, fsync=True)
    result: dict[str, Any] = {
        "bench": "cluster_meta", "clients": args.clients, "files_per_client": args.files,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m_start": os.getloadavg()[0]},
    }
    try:
        with running_moto() as moto, tempfile.TemporaryDirectory(prefix="tierd-bench-") as base:
            moto.client().create_bucket(Bucket="tierd-cold")
            cold = Cold("s3", Path(base), server=moto)
            single = Tierd(Path(base) / "single", cold, mount=True, **SETTINGS)
            with running(single):
                assert single.mnt is not None
                (single.mnt / "bench").mkdir()
                result["lmdb_1_node"] = _workload([single.mnt], args.clients, args.files, "l")
            with running_cluster(Path(base) / "cluster", pg, moto, 3, **SETTINGS) as cluster:
                (cluster[1].mnt / "bench").mkdir()
                mounts = [n.mnt for n in cluster.nodes]
                proc = cluster.nodes[0].proc
                spy = proc.pid if args.spy and proc is not None else None
                result["pg_3_nodes"] = _workload(mounts, args.clients, args.files, "p", spy)
                result["pg_1_node"] = _workload(mounts[:1], args.clients, args.files, "p1")
    finally:
        pg.stop()
    result["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
