"""Metadata operations per second through FUSE mounts: 8 clients spread over the three nodes
of a cluster (one PostgreSQL database) against the same 8 clients on one node with the
embedded lmdb store.

The test cluster of tests/cluster/clusterlib.py (one PostgreSQL server with fsync on, one
moto server as the cold store, three ``tierd serve``) and, in the same run, one ``tierd
serve`` on lmdb (tests/durability/coldlib.py) over the same cold store.  Each client is a
thread making ``--files`` files in a directory of its own through its node's mount, then
stats, renames and unlinks them: create (open O_CREAT|O_EXCL + close), stat, rename, unlink,
each phase timed from the first client's start to the last one's end.  Write-back is held
back (the files are empty anyway).  Prints one JSON document; ``--out FILE`` writes it there
too.

    .venv/bin/python bench/cluster_meta.py --clients 8 --files 200 \\
        --out bench/results/cluster_meta.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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


def _workload(mounts: list[Path], clients: int, files: int, tag: str) -> dict[str, float]:
    """The four phases with ``clients`` clients, client k on ``mounts[k % len(mounts)]``."""
    dirs = []
    for k in range(clients):
        d = mounts[k % len(mounts)] / "bench" / f"{tag}-c{k}"
        d.mkdir(parents=True)
        dirs.append(d)
    ops = (_create, _stat, _rename, _unlink)
    return {name: round(_phase(dirs, files, op), 1)
            for name, op in zip(PHASES, ops, strict=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--files", type=int, default=200, help="files per client")
    ap.add_argument("--out", type=Path)
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
                result["pg_3_nodes"] = _workload(mounts, args.clients, args.files, "p")
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
