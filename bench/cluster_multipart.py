"""CompleteMultipartUpload on a cluster: parts on other nodes against parts on the completing
node.

A real three-node cluster on this machine (tests/cluster/clusterlib.py: one PostgreSQL, one
moto server over HTTP, three ``tierd serve``), write-back held back (``persist_delay``
600 s).  Each round uploads ``--parts`` parts of ``--part-mib`` MiB twice: once through n1
and n3 in turn (n2 completes: every byte is fetched from their peer doors,
tierd/namespace/mpu_remote.py), once all through n2 (n2 completes: the upload's data file
becomes the object, no byte copied).  Only the Complete is timed; every object is read back
on n1 and checked byte for byte.  Medians over ``--rounds``; one JSON document printed.

    .venv/bin/python bench/cluster_multipart.py --parts 4 --part-mib 64 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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

BUCKET = "bench-mpu"
MIB = 1 << 20


def one(c: Cluster, key: str, via: list[int], data: list[bytes]) -> float:
    """Seconds n2 took to complete an upload whose part n went through node via[n-1]."""
    s = {i: c[i].s3(read_timeout=600) for i in (1, 2, 3)}
    up = s[2].create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = [{"PartNumber": n, "ETag": s[v].upload_part(
        Bucket=BUCKET, Key=key, UploadId=up, PartNumber=n, Body=d)["ETag"]}
        for n, (v, d) in enumerate(zip(via, data, strict=True), 1)]
    t0 = time.monotonic()
    s[2].complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=up,
                                   MultipartUpload={"Parts": parts})
    took = time.monotonic() - t0
    got = s[1].get_object(Bucket=BUCKET, Key=key)["Body"].read()
    if hashlib.sha256(got).digest() != hashlib.sha256(b"".join(data)).digest():
        raise SystemExit(f"{key}: n1 reads other bytes than were uploaded")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", type=int, default=4)
    ap.add_argument("--part-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (./dev.sh setup)")
    data = [os.urandom(a.part_mib * MIB) for _ in range(a.parts)]
    mib = a.parts * a.part_mib
    times: dict[str, list[float]] = {"remote": [], "local": []}
    with running_moto() as moto:
        moto.client().create_bucket(Bucket="tierd-cold")
        pg = PgServer(bindir, fsync=False)
        try:
            with tempfile.TemporaryDirectory() as base, running_cluster(
                    Path(base), pg, moto, 3, TIERD_PERSIST_DELAY="600") as c:
                c[1].s3().create_bucket(Bucket=BUCKET)
                for r in range(a.rounds):
                    times["remote"].append(one(c, f"r{r}", [(1, 3)[n % 2]
                                                            for n in range(a.parts)], data))
                    times["local"].append(one(c, f"l{r}", [2] * a.parts, data))
        finally:
            pg.stop()
    out: dict[str, Any] = {"parts": a.parts, "part_mib": a.part_mib, "rounds": a.rounds,
                           "load": os.getloadavg()[0]}
    for k, ts in times.items():
        med = statistics.median(ts)
        out[k] = {"complete_s": round(med, 3), "mib_s": round(mib / med, 1),
                  "all_s": [round(t, 3) for t in ts]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
