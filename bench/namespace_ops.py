"""Namespace cost against the raw hot-tier directory (method: shared/BENCHMARKING.md).

Two experiments, each run as baseline/tierd pairs (A B A B ...), medians and the median of
pair-wise ratios printed and written as JSON:

* ``meta``: create + close, stat, rename, unlink of N small files (metadata path).
  Baseline: the same os calls on a directory of the hot tier's file system.
* ``write``: sequential 1 MiB writes of a SIZE file ending in fsync, then a warm read.
  Baseline: os.pwrite/os.pread on a file in the same file system.

* ``--persister``: the persister's work per file, alone (no baseline): the event loop's
  CPU (the main thread's) per create while files wait out their persist delay, per file
  persisted and the files persisted per second (``drain``), per unlink of a persisted file
  until its object is gone, and per temporary file (created and unlinked within the delay).
  Run it once per tree to compare (``PYTHONPATH=TREE``), alternating.

Usage: python bench/namespace_ops.py [--files 10000] [--size-mib 1024] [--pairs 3]
       python bench/namespace_ops.py --persister [--files 3000] [--pairs 1] [--pace 0.001]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchlib import self_cpu

from tierd import __version__
from tierd.acl import Identity
from tierd.config import Config
from tierd.meta import MetaStore
from tierd.namespace import Namespace
from tierd.placement.ops import placement_from_config

ROOT = Identity.ROOT
CHUNK = 1 << 20


async def raw_meta(base: Path, n: int) -> None:
    d = base / "raw"
    d.mkdir()
    for i in range(n):
        fd = os.open(d / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
    for i in range(n):
        os.stat(d / f"f{i}")
    for i in range(n):
        os.rename(d / f"f{i}", d / f"g{i}")
    for i in range(n):
        os.unlink(d / f"g{i}")


async def open_ns(base: Path, persist_delay: float | None = None) -> Namespace:
    """The namespace as the daemon builds it over ``base`` with default settings (placement
    over hot and the embedded ``file://`` cold store); everything it writes here is dirty."""
    cfg = Config(data_dir=base) if persist_delay is None else Config(
        data_dir=base, persist_delay=persist_delay)
    for d in (cfg.hot_dir, cfg.cold_dir):
        d.mkdir(parents=True, exist_ok=True)
    meta = MetaStore.open_lmdb(cfg.meta_dir)
    p = await placement_from_config(cfg, meta)
    return await Namespace.load(meta, cfg.hot_dir, umask=cfg.umask, placement=p)


async def close_ns(ns: Namespace) -> None:
    await ns.close()
    await ns.placement.shutdown()
    ns.meta.close()


async def ns_meta(base: Path, n: int) -> None:
    ns = await open_ns(base)
    b = await ns.create_bucket(ROOT, "bench")
    for i in range(n):
        _, fh = await ns.create(ROOT, b.ino, f"f{i}".encode(), 0o644, os.O_WRONLY)
        await ns.release(fh)
    for i in range(n):
        await ns.lookup(ROOT, b.ino, f"f{i}".encode())
    for i in range(n):
        await ns.rename(ROOT, b.ino, f"f{i}".encode(), b.ino, f"g{i}".encode())
    for i in range(n):
        await ns.unlink(ROOT, b.ino, f"g{i}".encode())
    await close_ns(ns)


async def persister_costs(base: Path, n: int, pace: float = 0.0) -> dict[str, float]:
    """The loop's CPU (us) per operation of each phase, and files persisted per second
    (see the module docstring); the persist delay is an hour, lifted by ``drain``.  With
    ``pace`` the loop idles that long after each create and unlink, as between the
    requests of a FUSE client (the persister wakes for each file, as in the daemon)."""
    ns = await open_ns(base, persist_delay=3600)
    p: Any = ns.placement
    txns = _count_txns(ns.meta)
    b = await ns.create_bucket(ROOT, "bench")
    out: dict[str, float] = {}

    async def creates(prefix: str) -> None:
        for i in range(n):
            _, fh = await ns.create(ROOT, b.ino, f"{prefix}{i}".encode(), 0o644, os.O_WRONLY)
            await ns.release(fh)
            if pace:
                await asyncio.sleep(pace)
        await asyncio.sleep(0.2)  # the persister's last wakes

    async def unlinks(prefix: str) -> None:
        for i in range(n):
            await ns.unlink(ROOT, b.ino, f"{prefix}{i}".encode())
            if pace:
                await asyncio.sleep(pace)

    async def drained() -> None:
        assert await p.drain(timeout=600)

    for name, phase in (("create", lambda: creates("f")), ("persist", drained),
                        ("unlink", lambda: unlinks("f")), ("unlink_persist", drained),
                        ("temp_create", lambda: creates("t")),
                        ("temp_unlink", lambda: unlinks("t")), ("temp_drain", drained)):
        c0, t0 = time.thread_time(), time.perf_counter()
        txns.clear()
        await phase()
        out[name + "_loop_cpu_us"] = (time.thread_time() - c0) / n * 1e6
        for kind in ("read", "write"):  # the metadata transactions begun, per file
            out[f"{name}_{kind}_txns"] = txns[kind] / n
        out[name + "_per_s"] = n / (time.perf_counter() - t0)
    await close_ns(ns)
    return out


def _count_txns(meta: MetaStore) -> Counter[str]:
    """Count the read (snapshot) and write transactions begun on ``meta`` from now on:
    the figures the machine's load does not blur."""
    seen: Counter[str] = Counter()
    m: Any = meta

    def counting(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        def counted(*a: Any, **kw: Any) -> Any:
            seen[kind] += 1
            return fn(*a, **kw)
        return counted

    for attr, kind in (("snapshot", "read"), ("asnapshot", "read"), ("write", "write"),
                       ("awrite", "write")):
        setattr(m, attr, counting(getattr(m, attr), kind))
    return seen


async def persister_rounds(n: int, pairs: int, workdir: Path,
                           pace: float) -> list[dict[str, float]]:
    rounds = []
    for _ in range(pairs):
        base = Path(tempfile.mkdtemp(dir=workdir))
        try:
            rounds.append(await persister_costs(base, n, pace))
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(json.dumps({k: round(v, 1) for k, v in rounds[-1].items()}), flush=True)
    return rounds


async def raw_write(base: Path, size: int) -> None:
    buf = os.urandom(CHUNK)
    fd = os.open(base / "raw.bin", os.O_CREAT | os.O_RDWR, 0o644)
    for off in range(0, size, CHUNK):
        os.pwrite(fd, buf, off)
    os.fsync(fd)
    for off in range(0, size, CHUNK):
        os.pread(fd, CHUNK, off)
    os.close(fd)


async def ns_write(base: Path, size: int) -> None:
    buf = os.urandom(CHUNK)
    ns = await open_ns(base)
    b = await ns.create_bucket(ROOT, "bench")
    _, fh = await ns.create(ROOT, b.ino, b"big.bin", 0o644, os.O_RDWR)
    for off in range(0, size, CHUNK):
        await ns.write(fh, off, buf)
    await ns.fsync(fh)
    for off in range(0, size, CHUNK):
        await ns.read(fh, off, CHUNK)
    await ns.release(fh)
    await close_ns(ns)


async def timed(fn: Callable[[Path], Awaitable[None]], workdir: Path) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(dir=workdir))
    try:
        c0, t0 = self_cpu(), time.perf_counter()
        await asyncio.wait_for(fn(base), timeout=600)
        return {"seconds": time.perf_counter() - t0, "cpu_seconds": self_cpu() - c0}
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def experiment(
    name: str, baseline: Callable[[Path], Awaitable[None]],
    subject: Callable[[Path], Awaitable[None]], pairs: int, workdir: Path, unit: float,
    unit_name: str,
) -> dict[str, object]:
    runs = []
    for _ in range(pairs):
        a = await timed(baseline, workdir)
        b = await timed(subject, workdir)
        runs.append({"baseline": a, "tierd": b, "ratio": b["seconds"] / a["seconds"]})
    med_a = statistics.median(r["baseline"]["seconds"] for r in runs)  # type: ignore[index]
    med_b = statistics.median(r["tierd"]["seconds"] for r in runs)  # type: ignore[index]
    ratio = statistics.median(r["ratio"] for r in runs)  # type: ignore[misc]
    print(f"{name:6s} baseline {unit / med_a:12.1f} {unit_name}   tierd {unit / med_b:12.1f} "
          f"{unit_name}   time ratio tierd/baseline {ratio:.2f}")
    return {"runs": runs, "median_baseline_s": med_a, "median_tierd_s": med_b,
            "median_ratio": ratio, "unit": unit_name, "per_run_units": unit}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=Path("bench/results/namespace_ops.json"))
    ap.add_argument("--persister", action="store_true",
                    help="only the persister's costs (printed per round, no JSON file)")
    ap.add_argument("--pace", type=float, default=0.0,
                    help="--persister: seconds the loop idles after each create/unlink")
    args = ap.parse_args()
    if args.persister:
        await persister_rounds(args.files, args.pairs, args.workdir, args.pace)
        return
    n, size = args.files, args.size_mib << 20
    result = {
        "inputs": vars(args) | {"workdir": str(args.workdir), "out": str(args.out)},
        "versions": {"tierd": __version__, "python": sys.version.split()[0]},
        "machine": {"nproc": os.cpu_count(), "platform": platform.platform(),
                    "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
        "note": "warm: the page cache is not dropped; meta ops = create+stat+rename+unlink",
        "meta": await experiment("meta", lambda b: raw_meta(b, n), lambda b: ns_meta(b, n),
                                 args.pairs, args.workdir, 4 * n, "ops/s"),
        "write": await experiment("write", lambda b: raw_write(b, size),
                                  lambda b: ns_write(b, size), args.pairs, args.workdir,
                                  2 * size / 2**20, "MiB/s (write+fsync, then read)"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
