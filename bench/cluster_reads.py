"""Reading on one node a file another node wrote: from the writer's hot tier over its peer
data door (the file is dirty: not in the cold store yet) against from the cold store (the
same file once persisted, read on a node that never held it), with the writer's own read of
its hot copy as the reference.

A real three-node cluster on this machine (tests/cluster/clusterlib.py: one PostgreSQL, one
moto server over HTTP as the cold store, three ``tierd serve``), write-back held back
(``persist_delay`` 600 s, ``dirty_limit`` 16 GiB: write-back would start at once past half
of it) until the bench asks for it.  Each round: PUT ``--mib`` MiB through
n1's S3 door; GET it on n2 (peer fetch from n1); persist it (``POST /v1/placement/persist``
on n1); GET it on n3 (from cold); GET it on n1 (its hot tier).  Every GET is checked byte
for byte.  Medians over ``--rounds``.  moto keeps objects in its own process's memory:
``cold`` is moto's speed over loopback, not a real object store's.  Prints one JSON
document; ``--out FILE`` writes it there too.

    .venv/bin/python bench/cluster_reads.py --mib 256 --rounds 3 \
        --out bench/results/cluster_reads.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

from cluster.clusterlib import Cluster, running_cluster  # noqa: E402
from meta.pg_server import PgServer, find_bindir  # noqa: E402
from moto_server import running_moto  # noqa: E402

BUCKET = "bench"


def _get(cluster: Cluster, i: int, key: str, want: bytes) -> float:
    """Seconds to GET ``key`` whole through node ``i``'s S3 door (bytes checked after)."""
    s3 = cluster[i].s3(read_timeout=600)
    t0 = time.perf_counter()
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    took = time.perf_counter() - t0
    if hashlib.sha256(body).digest() != hashlib.sha256(want).digest():
        raise SystemExit(f"n{i} read other bytes for {key}")
    return took


def _round(cluster: Cluster, n: int, size: int) -> dict[str, float]:
    key = f"r{n}"
    data = os.urandom(size)
    t0 = time.perf_counter()
    cluster[1].s3(read_timeout=600).put_object(Bucket=BUCKET, Key=key, Body=data)
    out = {"put_n1": time.perf_counter() - t0}
    if f"{BUCKET}/{key}" in cluster.cold.objects():
        raise SystemExit("the file was persisted before the peer read: not a dirty read")
    out["peer_n2"] = _get(cluster, 2, key, data)
    if f"{BUCKET}/{key}" in cluster.cold.objects():
        raise SystemExit("the file was persisted during the peer read: not a dirty read")
    t0 = time.perf_counter()
    cluster[1].persist_wait(BUCKET, timeout=600)
    out["persist_n1"] = time.perf_counter() - t0
    out["cold_n3"] = _get(cluster, 3, key, data)
    out["hot_n1"] = _get(cluster, 1, key, data)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="file size in MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    size = args.mib << 20
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (./dev.sh setup installs it)")
    pg = PgServer(bindir, fsync=True)
    try:
        with running_moto() as moto, tempfile.TemporaryDirectory(prefix="tierd-bench-") as base:
            moto.client().create_bucket(Bucket="tierd-cold")
            with running_cluster(Path(base), pg, moto, 3, TIERD_PERSIST_DELAY="600",
                                 TIERD_DIRTY_LIMIT="16GiB",
                                 TIERD_LOG_LEVEL="warning") as cluster:
                cluster[1].s3().create_bucket(Bucket=BUCKET)
                rounds = [_round(cluster, n, size) for n in range(args.rounds)]
    finally:
        pg.stop()
    result: dict[str, Any] = {
        "bench": "cluster_reads", "mib": args.mib, "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_1m": os.getloadavg()[0]},
        "seconds": rounds,
        "median_MB_per_s": {k: round(size / statistics.median(r[k] for r in rounds) / 1e6, 1)
                            for k in rounds[0] if k != "persist_n1"},
        "median_persist_s": round(statistics.median(r["persist_n1"] for r in rounds), 2),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
