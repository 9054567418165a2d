"""Differential test of the cluster: random operation sequences spread over the three nodes'
doors, each operation's outcome (value or error) compared with the same operation on one
local directory, the model.

Operations are whole-file and each ends before the next begins (close-to-open: a writer
closes before anyone reads): S3 PUT, GET, HEAD, DELETE and listings on any node's S3 door,
and -- in the ``mixed`` variant -- writes, appends, reads, unlinks and renames through any
node's FUSE mount too.  Write-back is held back (30 s), so reads on one node meet objects
another node holds dirty (the peer door); with write-back running meanwhile, two nodes
writing one key race in the cold store and an import may bring a deleted key back
(docs/cluster.md, "Not yet"), so that case is not compared here.  At the end every node
lists and reads back the model's whole tree by S3 (and, mixed, through its mount).

A read or listing through a mount may lag another node's change by the time the change feed
takes to reach that node's kernel caches (docs/cluster.md, "Consistency"): such an
observation that differs from the model is repeated for up to :data:`STALE_S` seconds, and
the longest lag seen is printed.  Changes are never retried.

The sequences are seeded (the seed is in the test id and the failure message) rather than
drawn by hypothesis: a cluster cannot be reset between examples cheaply.
"""

from __future__ import annotations

import errno
import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from .clusterlib import Cluster
from .traffic import listed

pytestmark = pytest.mark.usefixtures("bucket")


@pytest.fixture(scope="module")
def cluster_settings() -> dict[str, str]:
    return {"TIERD_PERSIST_DELAY": "30"}


BUCKET = "differential"
DIRS = ("d0", "d1")
FILES = ("f0", "f1", "f2", "f3")
S3_OPS = ("put", "put", "get", "get", "head", "delete", "list")
FUSE_OPS = ("fwrite", "fwrite", "fappend", "fread", "fread", "funlink", "frename", "flist")
Outcome = tuple[str, Any]
#: the longest a mount's read or listing may lag another node's change
STALE_S = 1.0


def gen_ops(seed: int, n: int, kinds: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """``n`` operations: (kind, node 1-3, key or dir, extra)."""
    r = random.Random(seed)

    def key() -> str:
        return f"{r.choice(DIRS)}/{r.choice(FILES)}"

    ops: list[tuple[Any, ...]] = []
    for _ in range(n):
        kind, node = r.choice(kinds), r.randint(1, 3)
        if kind in ("put", "fwrite", "fappend"):
            data = bytes([r.randint(97, 122)]) * r.choice((0, 1, 100, 5000, 70_000))
            ops.append((kind, node, key(), data))
        elif kind == "frename":
            ops.append((kind, node, key(), key()))
        elif kind in ("list", "flist"):
            ops.append((kind, node, r.choice(DIRS), None))
        else:
            ops.append((kind, node, key(), None))
    return ops


def err(e: OSError) -> Outcome:
    return ("err", errno.errorcode.get(e.errno or 0, str(e.errno)))


def apply_model(root: Path, op: tuple[Any, ...]) -> Outcome:
    """``op`` on the local directory, with the S3 operations as their file equivalents."""
    kind, _, path, extra = op
    p = root / path
    try:
        if kind in ("put", "fwrite"):
            p.write_bytes(extra)
        elif kind == "fappend":
            with open(p, "ab") as f:
                f.write(extra)
        elif kind in ("get", "fread"):
            return ("ok", p.read_bytes())
        elif kind == "head":
            return ("ok", p.stat().st_size)
        elif kind == "delete":
            p.unlink(missing_ok=True)  # S3 DELETE of a missing key succeeds
        elif kind == "funlink":
            p.unlink()
        elif kind == "frename":
            os.rename(p, root / extra)
        else:
            assert kind in ("list", "flist"), kind
            return ("ok", sorted(os.listdir(p)))
    except OSError as e:
        return err(e)
    return ("ok", None)


def apply_cluster(cluster: Cluster, s3s: dict[int, Any], op: tuple[Any, ...]) -> Outcome:
    kind, i, path, extra = op
    node, s3 = cluster[i], s3s[i]
    try:
        if kind == "put":
            s3.put_object(Bucket=BUCKET, Key=path, Body=extra)
        elif kind == "get":
            return ("ok", s3.get_object(Bucket=BUCKET, Key=path)["Body"].read())
        elif kind == "head":
            return ("ok", s3.head_object(Bucket=BUCKET, Key=path)["ContentLength"])
        elif kind == "delete":
            s3.delete_object(Bucket=BUCKET, Key=path)
        elif kind == "list":
            keys = listed(node, BUCKET, path + "/")  # a directory's marker ends with "/"
            return ("ok", sorted(k[len(path) + 1:] for k in keys if not k.endswith("/")))
        else:
            return apply_mount(node.path(BUCKET), op)
    except ClientError as e:
        status = e.response["ResponseMetadata"]["HTTPStatusCode"]
        return ("err", "ENOENT") if status == 404 else ("http", status)
    return ("ok", None)


def apply_mount(root: Path, op: tuple[Any, ...]) -> Outcome:
    """The FUSE operations are the model's own calls, on the node's mount."""
    return apply_model(root, op)


@pytest.fixture(scope="module")
def model_dirs(cluster: Cluster) -> Iterator[Path]:
    """A parent for the per-sequence model directories."""
    with tempfile.TemporaryDirectory(prefix="tierd-cluster-model-") as d:
        yield Path(d)


def run(cluster: Cluster, model_dirs: Path, seed: int, kinds: tuple[str, ...],
        n: int = 60) -> None:
    prefix = f"s{seed}-{'s3' if kinds == S3_OPS else 'mixed'}"
    model = model_dirs / prefix
    model.mkdir()
    for d in DIRS:  # explicit directories on both sides (S3 would prune implicit ones)
        (model / d).mkdir()
        cluster[1].path(BUCKET, f"{prefix}/{d}").mkdir(parents=True)
    s3s = {i: cluster[i].s3() for i in (1, 2, 3)}
    log: list[str] = []
    lags: list[float] = []
    for op in gen_ops(seed, n, kinds):
        op = (op[0], op[1], f"{prefix}/{op[2]}",
              f"{prefix}/{op[3]}" if op[0] == "frename" else op[3])
        want = apply_model(model_dirs, op)
        got = apply_cluster(cluster, s3s, op)
        if got != want and op[0] in ("fread", "flist"):  # a kernel cache not reached yet
            t0 = time.monotonic()
            while got != want and time.monotonic() - t0 < STALE_S:
                time.sleep(0.005)
                got = apply_cluster(cluster, s3s, op)
            lags.append(time.monotonic() - t0)
        log.append(f"{op[0]} n{op[1]} {op[2]} {short(op[3])} -> {short(want)}")
        assert got == want, (f"seed {seed}: {op[0]} on n{op[1]} of {op[2]}: cluster "
                             f"{short(got)}, model {short(want)}\n" + "\n".join(log))
    if lags:
        print(f"seed {seed}: {len(lags)} mount reads lagged, the longest {max(lags):.3f} s")
    # the end state, through every node's S3 door
    files = {str(p.relative_to(model_dirs)): p.read_bytes()
             for p in model.rglob("*") if p.is_file()}
    for i in (1, 2, 3):
        keys = {k for k in listed(cluster[i], BUCKET, prefix + "/") if not k.endswith("/")}
        assert keys == set(files), f"seed {seed}: n{i} lists {sorted(keys ^ set(files))}"
        for key, data in files.items():
            body = s3s[i].get_object(Bucket=BUCKET, Key=key)["Body"].read()
            assert body == data, f"seed {seed}: n{i} reads other bytes for {key}"
            if kinds != S3_OPS:
                assert cluster[i].path(BUCKET, key).read_bytes() == data, (seed, i, key)


def short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 60 else text[:40] + f"...({len(text)} chars)"


def _seeds(default: list[int], offset: int) -> list[int]:
    """The seeds a run draws: ``default``, or with ``CLUSTER_DIFF_SEEDS=a-b`` (a longer
    hunt) seeds ``a`` to ``b`` shifted by ``offset`` (so the two variants differ)."""
    spec = os.environ.get("CLUSTER_DIFF_SEEDS")
    if not spec:
        return default
    lo, _, hi = spec.partition("-")
    return [offset + n for n in range(int(lo), int(hi or lo) + 1)]


@pytest.mark.parametrize("seed", _seeds([1, 2, 3], 0))
def test_s3_doors_of_three_nodes_behave_as_one_directory(
        cluster: Cluster, model_dirs: Path, seed: int) -> None:
    run(cluster, model_dirs, seed, S3_OPS)


@pytest.mark.parametrize("seed", _seeds([11, 12, 13], 10_000))
def test_s3_doors_and_mounts_of_three_nodes_behave_as_one_directory(
        cluster: Cluster, model_dirs: Path, seed: int) -> None:
    run(cluster, model_dirs, seed, S3_OPS + FUSE_OPS)
