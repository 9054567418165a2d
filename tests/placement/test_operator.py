"""Operator commands end to end: a real ``tierd serve`` and ``tierctl`` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tierd.meta import Inode, MetaTxn
from tierd.placement.ops import PlacementOps
from tierd.tiers import BLOCK_SIZE

from .conftest import ROOT, Env, write_file


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(extra)
    return env


def test_tierctl_placement_commands(tmp_path: Path) -> None:
    data, cold = tmp_path / "data", tmp_path / "cold"
    (cold / "opsx" / "ds").mkdir(parents=True)
    payload = os.urandom(2 * BLOCK_SIZE + 7)
    (cold / "opsx" / "ds" / "a.bin").write_bytes(payload)
    with open(tmp_path / "tierd.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data),
             "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=_env(TIERD_COLD_URL=f"file://{cold}", TIERD_WARM_ENABLED="true"))
    try:
        ep = data / "endpoints.json"
        deadline = time.monotonic() + 30
        while not ep.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        url = json.loads(ep.read_text())["admin"]["url"]

        def ctl(*args: str) -> str:
            r = subprocess.run([sys.executable, "-m", "tierd_client.tierctl", *args],
                               capture_output=True, text=True, timeout=60,
                               env=_env(TIERD_ADMIN_URL=url, TIERD_DATA_DIR=str(data)))
            assert r.returncode == 0, r.stderr + r.stdout
            return r.stdout

        assert "imported 2" in ctl("import", "opsx/ds/")
        ctl("warmup", "opsx/ds/")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["hot"] == len(payload) and du["files"] == 1
        ctl("pin", "opsx/ds/")
        header, *rows = ctl("policy", "get").splitlines()
        assert header.split() == ["PREFIX", "MODE", "PIN", "TIER"]
        assert ["opsx/ds/", "write-back", "yes", "hot"] in [r.split() for r in rows]
        assert "evicted 0 B" in ctl("evict", "opsx/")
        ctl("unpin", "opsx/ds/")
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/")
        assert json.loads(ctl("du", "opsx/", "--json"))["tiers"]["hot"] == 0
        ctl("warmup", "opsx/ds/", "--tier", "warm")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["warm"] == len(payload) and du["tiers"]["hot"] == 0
        header, row = ctl("du", "opsx/").splitlines()
        cols = dict(zip(header.split(), row.replace(" MiB", "MiB").replace(" B", "B").split(),
                        strict=True))
        assert (cols["WARM"], cols["HOT"], cols["FILES"]) == ("8.0MiB", "0B", "1")
        ctl("warmup", "opsx/ds/")  # hot again: copied up from warm
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/", "--tier", "hot")  # warm has it
        assert "evicted 8.0 MiB" in ctl("evict", "opsx/", "--tier", "warm")
        du = json.loads(ctl("du", "opsx/", "--json"))
        assert du["tiers"]["warm"] == du["tiers"]["hot"] == 0
        assert json.loads(ctl("policy", "set", "opsx/ds/", "--tier", "warm", "--json")
                          )["tier"] == "warm"
        assert ctl("policy", "set", "opsx/ds/", "--tier", "warm").splitlines()[1].split() == [
            "opsx/ds/", "write-back", "no", "warm"]
        ctl("policy", "set", "opsx/tmp/", "--mode", "cache-only")
        assert "persisted" in ctl("persist", "--wait", "opsx/")
    finally:
        proc.terminate()
        proc.wait(20)


async def test_operator_commands_touch_only_the_prefix_subtree(
        file_env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    ns, p = await file_env.open()
    ops = PlacementOps(p)
    try:
        b = await ns.create_bucket(ROOT, "sbx")
        a = await ns.mkdir(ROOT, b.ino, b"a", 0o755)
        sub = await ns.mkdir(ROOT, a.ino, b"sub", 0o755)
        big = await ns.mkdir(ROOT, b.ino, b"big", 0o755)
        f1 = await write_file(ns, a.ino, b"one", b"1" * 10)
        await write_file(ns, sub.ino, b"two", b"2" * 20)
        await write_file(ns, b.ino, b"ab", b"3" * 30)  # matches "sbx/a", not "sbx/a/"
        await write_file(ns, b.ino, b"b", b"4" * 40)
        for i in range(150):
            await write_file(ns, big.ino, b"f%03d" % i, b"x")
        await ns.link(ROOT, f1, a.ino, b"one-again")  # a hard link: counted once
        assert await p.drain(timeout=30)
        reads: list[int] = []
        orig = MetaTxn.get_inode

        def counting(self: MetaTxn, ino: int) -> Inode | None:
            reads.append(ino)
            return orig(self, ino)

        def no_full_scan(self: MetaTxn) -> Iterator[Inode]:
            raise AssertionError("an operator command walked every inode")

        monkeypatch.setattr(MetaTxn, "get_inode", counting)
        monkeypatch.setattr(MetaTxn, "iter_inodes", no_full_scan)
        du = ops.du("sbx/a/")
        assert (du["files"], du["bytes"]) == (2, 30)
        assert len(reads) < 20, len(reads)  # not the 150 files beside it
        assert (ops.du("sbx/a")["files"], ops.du("sbx/a")["bytes"]) == (3, 60)
        assert ops.du("sbx/b")["files"] == 151 and ops.du("sbx/")["files"] == 154
        assert ops.du("sb")["files"] == ops.du("")["files"] == 154
        assert ops.du("sbx/nope/")["files"] == 0 and ops.du("zzz/")["files"] == 0
        reads.clear()
        assert await p.drain("sbx/a/", timeout=5)
        assert (await ops.evict("sbx/a/"))["evicted"] == 30
        assert [d async for d in ops.warmup("sbx/a/")][-1]["done"] == 30
        assert len(reads) < 60, len(reads)
    finally:
        await file_env.close()
