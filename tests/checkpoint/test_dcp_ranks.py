"""DCP under ``torchrun``: 4 CPU ranks (gloo) save through one daemon and through two
(two data directories sharing one cold store, as two nodes), a 2-rank job loads what they
saved (resharding) and compares every shard byte for byte with the same state saved by
``dcp.FileSystemWriter``; a rank killed mid-save leaves no step behind.  The worker is
``dcp_job.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tierd_client.checkpoint import Checkpointer
from tierd_client.pool import PoolClient

from .conftest import Tierd

JOB = Path(__file__).with_name("dcp_job.py")


def torchrun(n: int, mode: str, step: int, out: Path, sockets: list[str],
             timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_SOCKETS=",".join(sockets), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={n}", str(JOB), mode, str(step), str(out)],
                          capture_output=True, text=True, env=env, timeout=timeout)


def check_load(out: Path, step: int) -> None:
    """Both ranks of the 2-rank load got every shard right, resharded from 4 parts."""
    for rank in (0, 1):
        doc = json.loads((out / f"load-{rank}.json").read_text())
        for n in (str(step), str(step + 1)):
            assert doc[n]["bad"] == [], (rank, n, doc)
            assert doc[n]["shards"]["model.w"] == [32, 24]  # 64 rows over 2 ranks


def steps(ck: Checkpointer) -> dict[int, dict[str, Any]]:
    return {s["step"]: s for s in ck.list("ranks")}


def ckpt_regions(t: Tierd) -> list[dict[str, Any]]:
    with PoolClient(t.socket) as c:
        return [r for r in c.regions() if r["name"] == "ckpt:ckr/ranks"]


def pool_was_used(t: Tierd) -> bool:
    """The ranks saved through the daemon's pool: a region of the run is in it, or was
    given back to a pool about to refuse an allocation (checkpoint/reclaim.py logs each).
    Not one region per rank: a rank takes any idle region of the run its daemon holds
    (``CheckpointService.region_for``), so ranks that save one after the other on a loaded
    machine share one, and the regions of a run with no client connected are a cache."""
    log = t.d.log.read_text(errors="replace")
    reclaimed = any("pool copy of a checkpoint reclaimed" in line and "ckr/ranks" in line
                    for line in log.splitlines())
    return bool(ckpt_regions(t)) or reclaimed


def test_four_ranks_one_daemon_save_reshard_load_and_a_rank_killed(tierd: Tierd,
                                                                  public_dir: Path) -> None:
    out = public_dir / "out"
    out.mkdir()
    r = torchrun(4, "save", 10, out, [tierd.socket])
    assert r.returncode == 0, r.stderr[-4000:]
    with Checkpointer(tierd.socket, bucket="ckr") as ck:
        got = steps(ck)
        assert sorted(got) == [10, 11]  # dcp.save and dcp.async_save
        assert all(got[n]["parts"] == 4 and got[n]["parts_here"] == [0, 1, 2, 3]
                   for n in got)
        assert ck.wait_persisted("ranks", 11, timeout=120) == "persisted"
    assert pool_was_used(tierd)
    s3 = tierd.d.client()
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="ckr", Prefix="ranks/step-10/")
            ["Contents"]}
    assert keys == {f"ranks/step-10/{leaf}" for leaf in
                    ("data-0", "data-1", "data-2", "data-3", "manifest.json")}

    r = torchrun(2, "load", 10, out, [tierd.socket])
    assert r.returncode == 0, r.stderr[-4000:]
    check_load(out, 10)

    r = torchrun(4, "die", 20, out, [tierd.socket])
    assert r.returncode != 0
    deadline = time.monotonic() + 30
    with Checkpointer(tierd.socket, bucket="ckr") as ck:
        while True:
            left = [o["Key"] for o in s3.list_objects_v2(Bucket="ckr", Prefix="ranks/")
                    .get("Contents", []) if "step-10/" not in o["Key"]
                    and "step-11/" not in o["Key"]]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert left == []  # nothing of step 20: no temporary directory, no part
        assert sorted(steps(ck)) == [10, 11]
    # every region is idle again, none was lost to the dead job
    assert all(not r["persistent"] or r["tenant"] == 0 for r in ckpt_regions(tierd))


@pytest.fixture
def two(public_dir: Path) -> Any:
    cold = public_dir / "cold"
    cold.mkdir()
    nodes = []
    for name in ("a", "b"):
        (public_dir / name).mkdir()
        nodes.append(Tierd(public_dir / name / "data", "--pool-capacity", "256MiB",
                           "--cold-url", f"file://{cold}"))
    yield nodes
    for t in nodes:
        t.stop()


def test_four_ranks_two_daemons(two: list[Tierd], public_dir: Path) -> None:
    a, b = two
    out = public_dir / "out"
    out.mkdir()
    r = torchrun(4, "save", 30, out, [a.socket, b.socket])
    assert r.returncode == 0, r.stderr[-4000:]
    for t, here in ((a, [0, 1]), (b, [2, 3])):
        with Checkpointer(t.socket, bucket="ckr") as ck:
            got = steps(ck)
            assert sorted(got) == [30, 31], (t.socket, got)
            assert [got[n]["parts_here"] for n in (30, 31)] == [here, here]
            # every part, this node's and the other's, reaches the shared cold store
            assert ck.wait_persisted("ranks", 31, timeout=120) == "persisted"
        assert pool_was_used(t)
    stored = {p.relative_to(public_dir / "cold").as_posix()
              for p in (public_dir / "cold").rglob("*") if p.is_file()}
    for n in (30, 31):
        assert {f"ckr/ranks/step-{n}/data-{i}" for i in range(4)} <= stored
        assert f"ckr/ranks/step-{n}/manifest.json" in stored
    assert not [k for k in stored if ".tierd-tmp" in k]

    r = torchrun(2, "load", 30, out, [a.socket, b.socket])  # rank 0 on a, rank 1 on b
    assert r.returncode == 0, r.stderr[-4000:]
    check_load(out, 30)
