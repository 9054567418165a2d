"""The POSIX checkpoint path into pool memory: a prefix with ``tier = mem`` set by
``tierctl policy set``, ``torch.save`` through the mount with write-temp-then-rename, the
file held as a region ``mem:<ino>`` in the pool (``tierctl pool status --json``), read back
with ``torch.load`` and ``cmp``, and dropped by ``tierctl evict --tier mem``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BUCKET, Daemon, run

pytest.importorskip("torch")

_SAVE = """
import os, sys, torch
d = sys.argv[1]
torch.manual_seed(1)
sd = {"w": torch.randn(1024, 1024), "step": 7}
tmp = os.path.join(d, "model.pt.tmp")
torch.save(sd, tmp)
with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
os.replace(tmp, os.path.join(d, "model.pt"))
got = torch.load(os.path.join(d, "model.pt"))
assert torch.equal(got["w"], sd["w"]) and got["step"] == 7
torch.save(sd, os.path.join(sys.argv[2], "model.pt.tmp"))  # the same bytes, off the mount
"""


def tierctl(daemon: Daemon, *args: str) -> str:
    r = run([sys.executable, "-m", "tierd_client.tierctl", "--data-dir", str(daemon.data_dir),
             *args])
    return r.stdout


def mem_regions(daemon: Daemon) -> dict[str, int]:
    doc = json.loads(tierctl(daemon, "pool", "status", "--json"))
    return {r["name"]: r["size"] for r in doc["region_list"] if r["name"].startswith("mem:")}


def test_torch_save_under_a_mem_policy_lands_in_the_pool(daemon: Daemon, work: Path,
                                                          tmp_path: Path) -> None:
    prefix = f"{BUCKET}/{work.name}/"
    tierctl(daemon, "policy", "set", prefix, "--tier", "mem")
    try:
        r = subprocess.run([sys.executable, "-c", _SAVE, str(work), str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        ino = os.stat(work / "model.pt").st_ino
        size = os.stat(work / "model.pt").st_size
        deadline = time.monotonic() + 30
        while mem_regions(daemon).get(f"mem:{ino}") != size:
            assert time.monotonic() < deadline, mem_regions(daemon)
            time.sleep(0.1)
        # the bytes read through the mount are those of the same save to a local disk
        run(["cmp", str(work / "model.pt"), str(tmp_path / "model.pt.tmp")])
        check = subprocess.run(
            [sys.executable, "-c", "import sys, torch; sd = torch.load(sys.argv[1]); "
             "print(sd['step'], tuple(sd['w'].shape))", str(work / "model.pt")],
            capture_output=True, text=True, timeout=120)
        assert check.stdout.strip() == "7 (1024, 1024)", check.stderr
        status = json.loads(tierctl(daemon, "status", "--json"))
        assert status["mem_tier"]["files"] >= 1 and status["mem_tier"]["used"] >= size
        du = json.loads(tierctl(daemon, "du", prefix, "--json"))
        assert du["tiers"]["mem"] >= size
        # the kernel sends the readers' RELEASE after their close returned, and a file still
        # open keeps its region: evict again until the last handle is gone
        deadline = time.monotonic() + 15
        while True:
            tierctl(daemon, "evict", prefix, "--tier", "mem")
            if f"mem:{ino}" not in mem_regions(daemon):
                break
            assert time.monotonic() < deadline, mem_regions(daemon)
            time.sleep(0.2)
        run(["cmp", str(work / "model.pt"), str(tmp_path / "model.pt.tmp")])  # from hot now
    finally:
        tierctl(daemon, "policy", "set", prefix, "--tier", "hot")
