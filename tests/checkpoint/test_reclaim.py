"""Memory that comes back: finished runs' pool copies are reclaimed when the pool is full
(least recently used first, never the newest step of an active run), and the memory tier
packs small files instead of taking 2 MiB of the pool for each."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from tierd_client.checkpoint import Checkpointer
from tierd_client.pool import PoolClient

from .conftest import Tierd

MiB = 1 << 20


def run_state(seed: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((18 * MiB // 4 - 64,), float(seed))}  # one 18 MiB region


def in_pool(ck: Checkpointer, run: str) -> bool:
    return bool(ck.list(run)[-1]["in_pool"])


def test_full_pool_reclaims_finished_runs_lru_but_not_an_active_runs_newest(
        public_dir: Path) -> None:
    t = Tierd(public_dir / "data", "--pool-capacity", "64MiB")
    try:
        active = Checkpointer(t.socket)  # run A's trainer stays connected
        active.save("A", 1, run_state(1))
        active.wait_persisted("A", 1, level="local")
        for run in ("B", "C"):  # finished runs: saved, their processes gone
            with Checkpointer(t.socket) as ck:
                ck.save(run, 1, run_state(2))
                ck.wait_persisted(run, 1, level="local")
            time.sleep(0.05)  # B is the least recently used
        with PoolClient(t.socket) as c:
            assert c.stats()["used"] == 3 * 18 * MiB  # 10 MiB left: D needs 18
        with Checkpointer(t.socket) as ck:
            ck.save("D", 1, run_state(4))  # refused ENOSPC before reclaim existed
            assert not in_pool(ck, "B")  # B's copy went (its step is on hot) ...
            assert in_pool(ck, "C") and in_pool(ck, "D")
            assert in_pool(ck, "A")  # ... the active run's newest step stayed
            assert torch.equal(ck.load("B")["w"], run_state(2)["w"])  # from hot
            ck.wait_persisted("D", 1, level="local")
            # a finished run is taken before an active run's older regions: E needs 18 MiB
            # again, and C (finished) is reclaimed although A was used longer ago
            ck.save("E", 1, run_state(5))
            assert in_pool(ck, "A") and not in_pool(ck, "C")
        active.save("A", 2, run_state(6))  # the active run reuses its region
        assert in_pool(active, "A")
        active.close()
    finally:
        t.stop()


def admin_ok(t: Tierd, method: str, path: str, doc: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    status, got = t.admin_call(method, path, doc)
    assert status in (200, 201, 202), (status, got)
    return got


def test_warmup_mem_packs_many_small_files(tierd: Tierd) -> None:
    s3 = tierd.d.client()
    s3.create_bucket(Bucket="small-files")
    n, size = 300, 10_000
    for i in range(n):
        s3.put_object(Bucket="small-files", Key=f"d/f{i:03}", Body=os.urandom(size))
    admin_ok(tierd, "PUT", "/v1/placement/policy", {"prefix": "small-files/d/", "tier": "mem"})
    job = admin_ok(tierd, "POST", "/v1/jobs", {"kind": "warmup", "prefix": "small-files/d/",
                                                "tier": "mem"})
    deadline = time.monotonic() + 120
    while (doc := admin_ok(tierd, "GET", f"/v1/jobs/{job['id']}"))["state"] in (
            "queued", "running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert doc["state"] == "done", doc
    assert doc["result"]["copied"] == {"mem": n * size}, doc  # what went where
    du = admin_ok(tierd, "GET", "/v1/placement/du?prefix=small-files/d/")
    assert du["tiers"]["mem"] == n * size  # every file in memory (128 fit at 2 MiB each)
    pool = admin_ok(tierd, "GET", "/v1/pool")
    assert pool["used"] <= 4 * MiB, pool  # 300 x 12 KiB pages in 2 MiB slabs
