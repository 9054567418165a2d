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
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer
from nsplacement import close_namespace, open_namespace

from tierd.errors import FsError, Reason
from tierd.meta import MetaStore
from tierd.placement.ops import PlacementOps
from tierd.tiers import TierThrottled, TierUnavailable

from .conftest import COLD_BUCKET, ROOT, Env, MiB, read_file, until, write_file


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
            assert ei.value.errno == errno.EIO and ei.value.reason is Reason.SERVICE_UNAVAILABLE
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


async def test_a_probe_answered_slow_down_finds_the_store_up(tmp_path: Path) -> None:
    """A probe the store answers "slow down" (TierThrottled) is an answer: the store is up,
    and persisting is not paused for it; a probe it does not answer is not."""
    env = Env("file", tmp_path, None)
    _, p = await env.open()
    try:
        async def throttled() -> None:
            raise TierThrottled("cold store throttled the request: SlowDown")

        async def down() -> None:
            raise TierUnavailable("cold store failed: ServiceUnavailable")

        p.cold.probe = throttled  # type: ignore[method-assign]
        assert await p._answers() is True
        p.cold.probe = down  # type: ignore[method-assign]
        assert await p._answers() is False
    finally:
        await env.close()


def _tierd(data_dir: Path, cold: Path, log: Path,
           extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    env.update(TIERD_COLD_URL=f"file://{cold}", TIERD_LOG_LEVEL="info",
               TIERD_COLD_CONCURRENCY="2")
    env.update(extra or {})
    cmd = [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data_dir),
           "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=f, env=env)


def test_sigkill_during_persistence_then_restart(tmp_path: Path) -> None:
    data_dir, cold = tmp_path / "data", tmp_path / "cold"
    files = {f"ckx/step/{i:02d}.bin": os.urandom(4 * MiB + i) for i in range(24)}

    async def prepare() -> None:  # committed but not persisted: a queue for the daemon
        meta = MetaStore.open_lmdb(data_dir / "meta")
        # hot-only: the files stay queued (never uploaded) for the daemon to persist
        ns = await open_namespace(meta, data_dir, cold_dir=cold)
        b = await ns.create_bucket(ROOT, "ckx")
        d = await ns.mkdir(ROOT, b.ino, b"step", 0o755)
        for k, data in files.items():
            await write_file(ns, d.ino, k.rsplit("/", 1)[1].encode(), data)
        await close_namespace(ns)
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


async def test_cold_hangs_mid_persistence_then_every_byte_persisted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The store stops answering (SIGSTOP: connections accepted, no replies) while uploads
    are in flight; its state survives, so afterwards every byte of every file is checked."""
    server = MotoServer().start()
    try:
        server.client().create_bucket(Bucket=COLD_BUCKET)
        env = Env("s3", tmp_path, server)
        env.settings.update(read_timeout=1.0, max_attempts=1)
        env.raw_put("hgx/uncached", os.urandom(MiB))
        ns, p = await env.open()
        try:
            await ns.list_objects(ROOT, "hgx")
            uncached = await ns.resolve(ROOT, "hgx/uncached")
            b = await ns.resolve(ROOT, "hgx")
            written = {}
            for i in range(4):  # the persister starts uploading these at once
                written[f"hgx/w{i}"] = data = os.urandom(3 * MiB + i)
                await write_file(ns, b.ino, b"w%d" % i, data)
            assert server._proc is not None
            os.kill(server._proc.pid, signal.SIGSTOP)
            try:
                for i in range(4, 6):  # writes continue into the dirty budget
                    written[f"hgx/w{i}"] = data = os.urandom(2 * MiB + i)
                    await write_file(ns, b.ino, b"w%d" % i, data)
                for k, data in written.items():  # written data is read from hot
                    inode = await ns.resolve(ROOT, k)
                    assert await read_file(ns, inode.ino) == data
                with pytest.raises(FsError) as ei:
                    await read_file(ns, uncached.ino)
                assert ei.value.errno == errno.EIO and ei.value.reason is Reason.SERVICE_UNAVAILABLE
                await until(lambda: p.cold_down, timeout=30)
                assert p.dirty_bytes > 0
                assert "cold store unavailable" in caplog.text
            finally:
                os.kill(server._proc.pid, signal.SIGCONT)
            assert await p.drain(timeout=120)  # resumes by itself
            assert not p.cold_down and p.dirty_bytes == 0
            for k, data in written.items():
                assert env.raw_get(k) == data, k
            assert len(await read_file(ns, uncached.ino)) == MiB
        finally:
            await env.close()
    finally:
        server.close()


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       capture_output=True)
    return r.returncode == 0


async def test_full_hot_tier_evicts_and_nothing_evictable_is_enospc(tmp_path: Path) -> None:
    """A real 20 MiB file system as the hot tier: reads of 32 MiB evict as they go; with
    12 MiB pinned, a 12 MiB object cannot land: ENOSPC (S3: 507), nothing corrupted."""
    hot = tmp_path / "hotfs"
    if not _mount_tmpfs(hot, "20m"):
        pytest.skip("needs root and tmpfs to build a small, really full file system")
    env = Env("file", tmp_path, None)
    env.hot_dir = hot
    try:
        scan = {f"fsx/scan/{i}": os.urandom(4 * MiB) for i in range(8)}
        keep = {f"fsx/keep/{i}": os.urandom(4 * MiB) for i in range(3)}
        big = os.urandom(12 * MiB)
        for k, v in {**scan, **keep, "fsx/big": big}.items():
            env.raw_put(k, v)
        ns, p = await env.open()
        ops = PlacementOps(p)
        await ns.list_objects(ROOT, "fsx")
        for k, v in scan.items():
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == v
        assert p.stats.evicted_bytes > 0
        await ops.set_policy("fsx/keep/", pin=True)
        assert [d async for d in ops.warmup("fsx/keep/")][-1]["done"] == 12 * MiB
        for k in scan:  # what may leave, leaves; the pins cannot
            await ops.evict(k)
        big_ino = (await ns.resolve(ROOT, "fsx/big")).ino
        with pytest.raises(FsError) as ei:
            await read_file(ns, big_ino)
        assert ei.value.errno == errno.ENOSPC
        with pytest.raises(FsError) as ei:
            await ns.get_object(ROOT, "fsx", "big")
        assert ei.value.errno == errno.ENOSPC  # InsufficientStorage (507) through S3
        for k, v in keep.items():  # nothing corrupted
            assert await read_file(ns, (await ns.resolve(ROOT, k)).ino) == v
        await ops.set_policy("fsx/keep/", pin=False)
        assert await read_file(ns, big_ino) == big  # evictable again: it fits
    finally:
        await env.close()
        subprocess.run(["umount", str(hot)], check=False)


def test_sigkill_during_persistence_to_s3_then_restart(
        tmp_path: Path, moto: MotoServer) -> None:
    data_dir = tmp_path / "data"
    prefix = f"k-{os.urandom(4).hex()}"
    files = {f"cks/step/{i:02d}.bin": os.urandom(4 * MiB + i) for i in range(16)}
    client = moto.client()

    async def prepare() -> None:
        meta = MetaStore.open_lmdb(data_dir / "meta")
        ns = await open_namespace(meta, data_dir)  # hot-only: queued for the daemon
        b = await ns.create_bucket(ROOT, "cks")
        d = await ns.mkdir(ROOT, b.ino, b"step", 0o755)
        for k, data in files.items():
            await write_file(ns, d.ino, k.rsplit("/", 1)[1].encode(), data)
        await close_namespace(ns)
        meta.close()

    def stored() -> dict[str, int]:
        r = client.list_objects_v2(Bucket=COLD_BUCKET, Prefix=prefix + "/")
        return {o["Key"][len(prefix) + 1:]: o["Size"] for o in r.get("Contents", [])}

    data_dir.mkdir()
    asyncio.run(prepare())
    s3 = {"TIERD_COLD_URL": f"s3://{COLD_BUCKET}/{prefix}", "TIERD_COLD_S3_ENDPOINT": moto.url,
          "TIERD_COLD_S3_ACCESS_KEY": ACCESS_KEY, "TIERD_COLD_S3_SECRET_KEY": SECRET_KEY,
          "TIERD_COLD_S3_REGION": REGION, "TIERD_COLD_S3_ADDRESSING": "path"}
    log = tmp_path / "tierd.log"
    proc = _tierd(data_dir, tmp_path / "unused", log, s3)
    deadline = time.monotonic() + 30
    while not stored() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert len(stored()) < len(files), "killed too late to test anything"
    proc = _tierd(data_dir, tmp_path / "unused", log, s3)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if stored() == {k: len(v) for k, v in files.items()}:
                break
            time.sleep(0.2)
        for k, v in files.items():
            body = client.get_object(Bucket=COLD_BUCKET, Key=f"{prefix}/{k}")["Body"].read()
            assert body == v, log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_placement_errors_map_to_s3_status_codes() -> None:
    """What the S3 door answers for placement's failures: cold down 503, a full local tier
    507, an object deleted from cold 404."""
    from tierd.s3.errors import from_fs_error

    cases = [(FsError(errno.EIO, "cold down", reason=Reason.SERVICE_UNAVAILABLE), 503,
              "ServiceUnavailable"),
             (FsError(errno.ENOSPC, "hot tier full"), 507, "InsufficientStorage"),
             (FsError(errno.ENOENT, "gone", reason=Reason.NO_SUCH_KEY), 404, "NoSuchKey")]
    for err, status, code in cases:
        s3 = from_fs_error(err)
        assert (s3.code, s3.status) == (code, status)
