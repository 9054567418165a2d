"""Placement benchmark against a moto server (one run, JSON out; see BENCHMARKING.md).

* ``cold_read``: first sequential read of an object through tierd (namespace read path,
  1 MiB reads, readahead, blocks landing on hot) vs boto3 ``download_file`` of the same
  object; A/B pairs, a fresh hot tier and a fresh import for every tierd run.
* ``hot_read``: later reads of the same file through tierd (all blocks on hot) vs a raw
  ``pread`` loop over the hot tier file, alternating, several rounds per pair, each round
  reading >= 1 GiB (one pass of 256 MiB is ~20 ms: one scheduling hiccup on a shared machine
  would decide a single-shot ratio); page cache warm for both (said so in the JSON).
* ``mem_read``: reads of the same file from the memory tier (a ``tier = "mem"`` policy: a
  copy in a pool region) vs a raw ``pread`` loop over the hot file, alternating; when root,
  the page cache is dropped before every round of both sides (the memory tier's point: its
  bytes do not depend on the page cache), else both are warm (said so in the JSON).
* ``policy``: hot hit ratio of 2Q vs plain LRU on a working-set-plus-scan block trace.

    .venv/bin/python bench/tiers_bench.py --pairs 3 --out bench/results/tiers.json

The default size is 256 MiB, not the issue's 1 GiB: moto answers every ranged GET by reading
the whole object (``FakeKey.value``) and slicing it, so a GET costs time proportional to the
object, and a 1 GiB object through boto3's 8 MiB ranges takes minutes per download.  For the
same reason the cold ratio mostly measures how many requests each client makes (tierd: a
sequential stream's windows in ranges of a quarter window, up to 16 MiB; boto3: 8 MiB).
``--size-mib 1024`` runs the issue's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from benchlib import drop_caches
from moto_server import ACCESS_KEY, REGION, SECRET_KEY, running_moto

from tierd.acl import Identity
from tierd.mempool import MemPool
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.placement import LRU, Placement, PlacementSettings, TwoQ
from tierd.tiers import LocalTier, open_object_tier

ROOT = Identity.ROOT
BUCKET = "bench-cold"
CHUNK = 1 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


HOT_ROUNDS = 7  # alternating (raw, tierd) rounds per pair...
HOT_BYTES = 1 << 30  # ...each reading the file as often as it takes to read >= 1 GiB
MEM_ROUNDS = 3  # alternating (raw from disk, tierd from the pool) rounds per pair



async def read_all(ns: Namespace, fh: int, size: int) -> None:
    pos = 0
    while data := await ns.read(fh, pos, CHUNK):
        pos += len(data)
    assert pos == size, pos


async def mem_rounds(ns: Namespace, p: Placement, fh: int, ino: int, hot_path: Path,
                     size: int) -> tuple[list[float], list[float]]:
    """MEM_ROUNDS alternating (raw pread loop over the hot file, tierd read served from the
    memory tier) rounds, the page cache dropped before each when root."""
    pool = MemPool(2 * size + (64 << 20))
    mem = p.attach_pool(pool, max_share=1.0)
    try:
        assert await p.admit_mem(ino, force=True), "the file did not go into the pool"
        raw_s: list[float] = []
        mem_s: list[float] = []
        for _ in range(MEM_ROUNDS):
            drop_caches()
            raw_s.append(raw_read(hot_path))
            drop_caches()
            hits = mem.stats["hits"]
            t0 = time.perf_counter()
            await read_all(ns, fh, size)
            mem_s.append(time.perf_counter() - t0)
            assert mem.stats["hits"] > hits, "reads were not served from the memory tier"
        return raw_s, mem_s
    finally:
        p.detach_pool()
        pool.close()


async def tierd_read(url: str, settings: dict[str, Any], base: Path, size: int
                     ) -> tuple[float, float, list[float], list[float], list[float],
                                list[float]]:
    """Cold read, then HOT_ROUNDS alternating (raw ``pread`` loop over the hot file, tierd
    read) rounds, then the memory-tier rounds; returns the cold time and CPU time, the hot
    times of each side and the memory-tier rounds' (raw, tierd) times."""
    meta = MetaStore.open_lmdb(base / "meta")
    hot = LocalTier(base / "hot", name="hot")
    p = Placement(meta, open_object_tier(url, **settings), hot,
                  PlacementSettings(import_ttl=0.0))
    await p.start()
    ns = await Namespace.load(meta, base / "hot", placement=p)
    try:
        inode = await ns.head_object(ROOT, "data", "big.bin")
        fh = await ns.open(ROOT, inode.ino, os.O_RDONLY)
        c0, t0 = cpu(), time.perf_counter()
        pos = 0
        while data := await ns.read(fh, pos, CHUNK):
            pos += len(data)
        cold_s, cold_cpu = time.perf_counter() - t0, cpu() - c0
        assert pos == size, pos
        raw_s: list[float] = []
        hot_s: list[float] = []
        passes = max(1, HOT_BYTES // size)
        for _ in range(HOT_ROUNDS):
            raw_s.append(sum(raw_read(Path(hot.path(inode.ino))) for _ in range(passes)))
            t0 = time.perf_counter()
            for _ in range(passes):
                pos = 0
                while data := await ns.read(fh, pos, CHUNK):
                    pos += len(data)
                assert pos == size, pos
            hot_s.append((time.perf_counter() - t0) / passes)
            raw_s[-1] /= passes
        mem_raw, mem_s = await mem_rounds(ns, p, fh, inode.ino, Path(hot.path(inode.ino)),
                                          size)
        await ns.release(fh)
        return cold_s, cold_cpu, raw_s, hot_s, mem_raw, mem_s
    finally:
        await ns.close()
        await p.shutdown()
        meta.close()


def raw_read(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        pos = 0
        while data := os.pread(fd, CHUNK, pos):
            pos += len(data)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def policy_trace(capacity: int = 1000, seed: int = 7) -> dict[str, Any]:
    """A working set (40% of capacity, Zipf-ish reuse) interleaved with sequential scans
    (each 3x the capacity, every key read once)."""
    rnd = random.Random(seed)
    trace: list[tuple[int, int]] = []
    ws = [(1, i) for i in range(int(capacity * 0.4))]
    for scan_no in range(1, 21):
        trace.extend(rnd.choice(ws) for _ in range(capacity * 2))
        trace.extend((100 + scan_no, i) for i in range(capacity * 3))
    out: dict[str, Any] = {"capacity_blocks": capacity, "accesses": len(trace)}
    for name, cache in (("2q", TwoQ(capacity)), ("lru", LRU(capacity))):
        hits = ws_hits = ws_total = 0
        for key in trace:
            if key in cache:
                hits += 1
                ws_hits += key[0] == 1
            ws_total += key[0] == 1
            cache.access(key)
            while len(cache) > capacity:
                cache.remove(next(cache.victims()))
        out[name] = {"hit_ratio": hits / len(trace), "working_set_hit_ratio": ws_hits / ws_total}
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    size = args.size_mib << 20
    work = Path(tempfile.mkdtemp(prefix="tiers-bench-"))
    runs: list[dict[str, Any]] = []
    with running_moto() as server:
        client = server.client()
        client.create_bucket(Bucket=BUCKET)
        src = work / "src.bin"
        with open(src, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(1 << 20))
        prefix = uuid.uuid4().hex[:8]
        client.upload_file(str(src), BUCKET, f"{prefix}/data/big.bin")
        src.unlink()
        url = f"s3://{BUCKET}/{prefix}"
        settings = {"endpoint_url": server.url, "region": REGION, "access_key": ACCESS_KEY,
                    "secret_key": SECRET_KEY, "addressing": "path"}
        for i in range(args.pairs):
            dst = work / "dl.bin"
            c0, t0 = cpu(), time.perf_counter()
            await asyncio.to_thread(client.download_file, BUCKET, f"{prefix}/data/big.bin",
                                    str(dst))
            boto_s, boto_cpu = time.perf_counter() - t0, cpu() - c0
            dst.unlink()
            base = work / f"run{i}"
            cold_s, tierd_cpu, raw_s, hot_s, mem_raw, mem_s = await tierd_read(
                url, settings, base, size)
            runs.append({"pair": i, "boto3_download_s": boto_s, "boto3_cpu_s": boto_cpu,
                         "tierd_cold_read_s": cold_s, "tierd_cold_cpu_s": tierd_cpu,
                         "tierd_hot_read_s": statistics.median(hot_s),
                         "raw_hot_read_s": statistics.median(raw_s),
                         "hot_rounds": {"raw_s": raw_s, "tierd_s": hot_s},
                         "hot_ratio": statistics.median(r / t for r, t in zip(raw_s, hot_s,
                                                                             strict=True)),
                         "mem_rounds": {"raw_s": mem_raw, "tierd_mem_s": mem_s},
                         "mem_ratio": statistics.median(r / t for r, t in zip(mem_raw, mem_s,
                                                                             strict=True))})
            shutil.rmtree(base)
    gib = size / (1 << 30)
    cold_ratios = [r["boto3_download_s"] / r["tierd_cold_read_s"] for r in runs]
    hot_ratios = [r["hot_ratio"] for r in runs]
    doc = {
        "benchmark": "tiers_bench", "size_bytes": size, "read_size": CHUNK,
        "notes": "cold: first read through tierd from moto (s3://, HTTP) vs boto3 download_file;"
                 " hot: later reads through the same handle vs a raw pread loop over the hot"
                 f" file, {HOT_ROUNDS} alternating rounds of >= 1 GiB per pair, page cache"
                 " warm for both (no drop_caches); mem: reads served from the memory tier vs"
                 " a raw pread loop over the hot file, page cache "
                 + ("dropped before every round of both" if os.geteuid() == 0 else
                    "warm (not root: no drop_caches)")
                 + "; CPU is this process's (user+sys), moto's is not counted",
        "nproc": os.cpu_count(),
        "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": sys.version.split()[0], "runs": runs,
        "median": {
            "boto3_GiB_s": gib / statistics.median(r["boto3_download_s"] for r in runs),
            "tierd_cold_GiB_s": gib / statistics.median(r["tierd_cold_read_s"] for r in runs),
            "tierd_hot_GiB_s": gib / statistics.median(r["tierd_hot_read_s"] for r in runs),
            "raw_hot_GiB_s": gib / statistics.median(r["raw_hot_read_s"] for r in runs),
        },
        "ratio": {"cold_tierd_vs_boto3": statistics.median(cold_ratios),
                  "hot_tierd_vs_raw": statistics.median(hot_ratios),
                  "mem_tierd_vs_raw_disk": statistics.median(r["mem_ratio"] for r in runs)},
        "cpu_s_per_GiB": {  # this process only (moto's CPU is not counted)
            "boto3_download": statistics.median(r["boto3_cpu_s"] for r in runs) / gib,
            "tierd_cold_read": statistics.median(r["tierd_cold_cpu_s"] for r in runs) / gib,
        },
        "policy": policy_trace(),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
