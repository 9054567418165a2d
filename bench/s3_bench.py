"""The S3 gateway against its baselines, with boto3 (method: shared/BENCHMARKING.md).

Experiments, each run as pairs (baseline, tierd, baseline, tierd, …; the order alternates
from pair to pair), reporting every run, the medians and the median of the pair-wise ratios
(tierd's rate / the baseline's rate, so > 1 means tierd is faster):

* ``large_put`` — one object of ``--large-mib`` MiB with ``upload_file`` (boto3's transfer
  manager: 8 MiB parts, 10 threads, CRC32 checksums on by default).  Baselines: moto, and
  ``disk``: the same bytes copied into the hot tier's file system and fsynced, no HTTP (the
  physical limit; this machine's disk varies several-fold from minute to minute), and
  ``null``: a server that reads and discards every body and stores nothing
  (``s3_servers.start_null``), the ceiling of boto3 itself on these cores.  Also
  how long each server stays busy after the upload and its CPU then (``drain_s``,
  ``drain_server_cpu_s_per_GiB``: tierd's write-back to the cold tier).
* ``large_get`` — the same object with ``download_fileobj`` (ranged GETs, 10 threads) into
  /dev/null.  Baselines: the aiohttp static-file server of the same bytes, and moto.
* ``large_get_stream`` — one ``get_object`` read as a stream (one connection).  Baseline:
  the static-file server.
* ``small_put`` / ``small_get`` — ``--small-count`` objects of ``--small-kib`` KiB with
  ``put_object``/``get_object`` from ``--procs`` client processes of ``--threads`` threads
  (8 requests in flight by default).  Baselines: moto (PUT and GET), the static-file
  server (GET) and the null server (PUT: boto3's own ceiling).  Each PUT run writes new keys
  (``--small-overwrite``: the same keys every run; see :func:`small_prefix`).
* ``rss`` — tierd's peak resident memory while ``--rss-streams`` concurrent PUTs of a
  ``--large-mib`` object, then as many concurrent GETs, run (the issue's limit: 300 MiB).

Every run starts after ``sync`` and once the server is idle (tierd persists what it took to
its cold tier in the background, after answering).  GETs are warm: the objects were just
written, so they are in the page cache (tierd, static) or in memory (moto).  The client and
the servers share the machine's cores: CPU seconds (user + sys) of the server process and
of the client are reported per GiB moved (and per operation for small objects).

Usage: python bench/s3_bench.py [--pairs 3] [--large-mib 1024] [--small-count 2000]
       [--out bench/results/s3_bench.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import s3_servers as servers
from benchlib import self_cpu
from s3_servers import Server

BUCKET = "bench"
GiB = 1 << 30
RUN_TIMEOUT = 600.0


class Data:
    """The bytes every server gets: one large file and many small payloads, also laid out
    as the static server's directory (``root/bench/...``)."""

    def __init__(self, work: Path, large_mib: int, count: int, kib: int) -> None:
        self.root = work / "static"
        (self.root / BUCKET / "small").mkdir(parents=True)
        self.large = self.root / BUCKET / "large.bin"
        block = os.urandom(64 << 20)
        with open(self.large, "wb") as f:
            left = large_mib << 20
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                block = block[n:] + block[:n]  # not one block repeated: defeat dedup
                left -= n
        self.large_size = large_mib << 20
        pool = os.urandom(count * kib * 1024)
        self.small = [pool[i * kib * 1024:(i + 1) * kib * 1024] for i in range(count)]
        for i, body in enumerate(self.small):
            (self.root / BUCKET / "small" / f"{i:05d}").write_bytes(body)

    def small_key(self, i: int) -> str:
        return f"small/{i:05d}"


def settle(server: Server, timeout: float = 300.0) -> float:
    """Start every run from a quiet machine: dirty pages written (``sync``) and the server
    idle (tierd persists what it took to the cold tier in the background, after the
    request that wrote it has been answered).  Seconds waited."""
    t0 = time.perf_counter()
    os.sync()
    if server.proc is None and server.moto is None:
        return time.perf_counter() - t0
    last = servers.cpu_seconds(server.pid)
    while time.perf_counter() - t0 < timeout:
        time.sleep(0.5)
        now = servers.cpu_seconds(server.pid)
        if now - last < 0.02:
            break
        last = now
    os.sync()
    return time.perf_counter() - t0


def measure(server: Server, nbytes: int, nops: int, fn: Callable[[], None],
            drain: bool = False) -> dict[str, Any]:
    """Run ``fn`` under a timeout; its wall time, rates and CPU seconds (server, client).
    ``drain``: then also how long the server stays busy afterwards and the CPU it spends
    (tierd's write-back of what it took to the cold tier, which the next run waits for in
    :func:`settle` and a sustained writer would compete with)."""
    waited = settle(server)
    has_process = server.proc is not None or server.moto is not None

    def server_cpu_now() -> float:  # the disk pseudo-server's work is the client's
        return servers.cpu_seconds(server.pid) if has_process else 0.0
    s0, c0, t0 = server_cpu_now(), self_cpu(), time.perf_counter()
    with cf.ThreadPoolExecutor(1) as ex:
        ex.submit(fn).result(timeout=RUN_TIMEOUT)
    wall = time.perf_counter() - t0
    server_cpu = server_cpu_now() - s0
    ccpu = self_cpu() - c0
    gib = nbytes / GiB
    out = {"server": server.name, "seconds": wall, "MiB_per_s": nbytes / 2**20 / wall,
           "ops_per_s": nops / wall, "server_cpu_s": server_cpu, "client_cpu_s": ccpu,
           "server_cpu_s_per_GiB": server_cpu / gib, "client_cpu_s_per_GiB": ccpu / gib,
           "settle_s": waited}
    if drain and has_process:
        d0 = server_cpu_now()
        out["drain_s"] = settle(server)
        out["drain_server_cpu_s_per_GiB"] = (server_cpu_now() - d0) / gib
    return out


# -- workloads -----------------------------------------------------------------------------

def disk_write(disk: Server, data: Data) -> dict[str, Any]:
    """The physical limit of a PUT: copy the large file into the tier's file system and
    fsync it (what tierd must at least do), no HTTP."""
    target = Path(disk.url) / "large.copy"

    def run() -> None:
        with open(data.large, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    try:
        return measure(disk, data.large_size, 1, run)
    finally:
        target.unlink(missing_ok=True)


def large_put(server: Server, data: Data) -> dict[str, Any]:
    if server.name == "disk":
        return disk_write(server, data)
    c = server.client()
    return measure(server, data.large_size, 1,
                   lambda: c.upload_file(str(data.large), BUCKET, "large.bin"), drain=True)


def large_get(server: Server, data: Data) -> dict[str, Any]:
    c = server.client()

    def run() -> None:
        with open(os.devnull, "wb") as sink:
            c.download_fileobj(BUCKET, "large.bin", sink)
    return measure(server, data.large_size, 1, run)


def large_get_stream(server: Server, data: Data) -> dict[str, Any]:
    c = server.client()

    def run() -> None:
        body = c.get_object(Bucket=BUCKET, Key="large.bin")["Body"]
        got = sum(len(chunk) for chunk in body.iter_chunks(1 << 20))
        assert got == data.large_size, got
    return measure(server, data.large_size, 1, run)


def _fan_out(n: int, threads: int, one: Callable[[int], None]) -> None:
    with cf.ThreadPoolExecutor(threads) as ex:
        for f in [ex.submit(one, i) for i in range(n)]:
            f.result()


def _small_worker(url: str, key: str, secret: str, op: str, root: str, indexes: list[int],
                  threads: int, ready: Any, go: Any, out: Any, prefix: str) -> None:
    """One client process of a small-object run: boto3 with ``threads`` threads."""
    s = Server("worker", None, url, key, secret)
    c = s.client()
    bodies = {i: (Path(root) / BUCKET / "small" / f"{i:05d}").read_bytes() for i in indexes}

    def one(i: int) -> None:
        k = f"{prefix}{i:05d}"
        if op == "put":
            c.put_object(Bucket=BUCKET, Key=k, Body=bodies[i])
        else:
            assert c.get_object(Bucket=BUCKET, Key=k)["Body"].read() == bodies[i]
    ready.put(os.getpid())
    go.wait()
    c0 = self_cpu()
    try:
        with cf.ThreadPoolExecutor(threads) as ex:
            for f in [ex.submit(one, i) for i in indexes]:
                f.result()
        out.put(("ok", self_cpu() - c0))
    except BaseException as e:
        out.put(("error", repr(e)))


def small_prefix(server: Server, overwrite: bool) -> str:
    """Where a small-PUT run writes: ``small/`` (what the GET runs read) the first time,
    then fresh keys per run unless ``overwrite`` -- new objects, as an ingest writes them.
    Overwriting costs tierd a file delete per PUT (moto nothing), and on a file system
    without a journal (ext4 as this VM has it) every create after many deletes scans past
    the recently freed inodes (``recently_deleted`` in the kernel): ``--small-overwrite``
    measures that case."""
    n = server.extra.get("small_put_runs", 0)
    server.extra["small_put_runs"] = n + 1
    return "small/" if n == 0 or overwrite else f"small-run{n}/"


def small_ops(server: Server, data: Data, op: str, procs: int, threads: int,
              prefix: str = "small/") -> dict[str, Any]:
    """``op`` (put/get) on every small object from ``procs`` client processes of
    ``threads`` threads each: one boto3 process is bound by its GIL well below what a fast
    server answers.  The processes start (and import boto3) before the clock starts."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    n = len(data.small)
    workers = [ctx.Process(target=_small_worker, args=(
        server.url, server.key, server.secret, op, str(data.root),
        list(range(w, n, procs)), threads, ready, go, out, prefix), daemon=True)
        for w in range(procs)]
    for w in workers:
        w.start()
    try:
        for _ in workers:
            ready.get(timeout=120)
        waited = settle(server)
        s0, t0 = servers.cpu_seconds(server.pid), time.perf_counter()
        go.set()
        results = [out.get(timeout=RUN_TIMEOUT) for _ in workers]
        wall = time.perf_counter() - t0
        server_cpu = servers.cpu_seconds(server.pid) - s0
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
    errors = [r[1] for r in results if r[0] != "ok"]
    if errors:
        raise RuntimeError(f"{server.name} small {op}: {errors[0]}")
    ccpu = sum(float(r[1]) for r in results)
    nbytes = n * len(data.small[0])
    gib = nbytes / GiB
    return {"server": server.name, "seconds": wall, "MiB_per_s": nbytes / 2**20 / wall,
            "ops_per_s": n / wall, "server_cpu_s": server_cpu, "client_cpu_s": ccpu,
            "server_cpu_s_per_GiB": server_cpu / gib, "client_cpu_s_per_GiB": ccpu / gib,
            "server_cpu_ms_per_op": 1000 * server_cpu / n,
            "client_cpu_ms_per_op": 1000 * ccpu / n, "settle_s": waited}


# -- experiments ---------------------------------------------------------------------------

def summarize(name: str, runs: list[dict[str, Any]], rate: str) -> dict[str, Any]:
    """Medians per server and, per baseline, the median of the pair-wise rate ratios."""
    by: dict[str, list[dict[str, Any]]] = {}
    for pair in runs:
        for server, r in pair.items():
            by.setdefault(server, []).append(r)
    keys = ("seconds", rate, "server_cpu_s_per_GiB", "client_cpu_s_per_GiB", "drain_s",
            "drain_server_cpu_s_per_GiB")
    med = {s: {k: statistics.median(r[k] for r in rs) for k in keys if k in rs[0]}
           for s, rs in by.items()}
    ratios = {f"tierd/{s}": statistics.median(p["tierd"][rate] / p[s][rate] for p in runs)
              for s in by if s != "tierd"}
    if "null" in by and "moto" in by:
        # the most any server could show against moto through this client on these cores
        ratios["null/moto"] = statistics.median(p["null"][rate] / p["moto"][rate]
                                                for p in runs)
    line = "  ".join(f"{s} {m[rate]:9.1f}" for s, m in med.items())
    print(f"{name:17s} {rate:10s} {line}  ratios " +
          " ".join(f"{k}={v:.2f}" for k, v in ratios.items()), flush=True)
    cpu = "  ".join(f"{s} {m['server_cpu_s_per_GiB']:.2f}+{m['client_cpu_s_per_GiB']:.2f}"
                    + (f" (then busy {m['drain_s']:.1f} s, {m['drain_server_cpu_s_per_GiB']:.2f}"
                       " s/GiB)" if "drain_s" in m else "") for s, m in med.items())
    print(f"{'':17s} CPU s/GiB server+client: {cpu}", flush=True)
    return {"runs": runs, "medians": med, "median_ratios": ratios, "rate": rate}


def rss_experiment(tierd: Server, data: Data, streams: int) -> dict[str, Any]:
    """Peak RSS of the daemon during ``streams`` concurrent PUTs, then GETs, of the large
    object (each PUT one request with the whole body streamed, each GET one stream)."""
    pid = tierd.pid
    c = tierd.client(max_pool_connections=streams * 2)
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(servers.rss(pid))
            time.sleep(0.02)

    def put(i: int) -> None:
        with open(data.large, "rb") as f:
            c.put_object(Bucket=BUCKET, Key=f"rss/{i}", Body=f)

    def get(i: int) -> None:
        body = c.get_object(Bucket=BUCKET, Key=f"rss/{i}")["Body"]
        got = sum(len(chunk) for chunk in body.iter_chunks(1 << 20))
        assert got == data.large_size

    out: dict[str, Any] = {"streams": streams, "object_MiB": data.large_size >> 20,
                           "rss_before_MiB": servers.rss(pid) / 2**20}
    for phase, fn in (("put", put), ("get", get)):
        samples.clear()
        stop.clear()
        hwm = servers.reset_peak_rss(pid)
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.perf_counter()
        _fan_out(streams, streams, fn)
        wall = time.perf_counter() - t0
        stop.set()
        t.join()
        peak = max([*samples, servers.rss(pid)])
        if hwm:
            peak = max(peak, servers.peak_rss(pid))
        out[phase] = {"seconds": wall, "MiB_per_s": streams * data.large_size / 2**20 / wall,
                      "peak_rss_MiB": peak / 2**20, "high_water_mark_used": hwm}
        print(f"rss {phase}: {streams} x {data.large_size >> 20} MiB in {wall:.1f} s, "
              f"daemon peak RSS {peak / 2**20:.0f} MiB", flush=True)
    for i in range(streams):
        c.delete_object(Bucket=BUCKET, Key=f"rss/{i}")
    return out


def run_pairs(name: str, pairs: int, baselines: list[Server], tierd: Server,
              fn: Callable[[Server], dict[str, Any]], rate: str) -> dict[str, Any]:
    runs = []
    for p in range(pairs):
        order = [*baselines, tierd] if p % 2 == 0 else [tierd, *baselines]
        runs.append({s.name: fn(s) for s in order})
    return summarize(name, runs, rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--large-mib", type=int, default=1024)
    ap.add_argument("--small-count", type=int, default=2000)
    ap.add_argument("--small-kib", type=int, default=16)
    ap.add_argument("--small-overwrite", action="store_true",
                    help="every small-PUT run rewrites the same keys (default: fresh keys)")
    ap.add_argument("--procs", type=int, default=2, help="client processes (small objects)")
    ap.add_argument("--threads", type=int, default=4, help="threads per client process")
    ap.add_argument("--rss-streams", type=int, default=8, help="0: skip the RSS experiment")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--out", type=Path, default=Path("bench/results/s3_bench.json"))
    ap.add_argument("--only", default="", help="comma-separated experiment names")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    work = Path(tempfile.mkdtemp(prefix="tierd-s3-bench-", dir=args.workdir))
    started: list[Server] = []
    try:
        data = Data(work, args.large_mib, args.small_count, args.small_kib)
        tierd = servers.start_tierd(work / "tierd")
        moto = servers.start_moto()
        static = servers.start_static(data.root)
        null = servers.start_null()
        started += [tierd, moto, static, null]
        for s in (tierd, moto):
            s.client().create_bucket(Bucket=BUCKET)
        # the raw file system of tierd's hot tier, as a pseudo server (no process)
        disk = Server("disk", None, str(work / "tierd"), "", "")
        import aiohttp
        import boto3
        import moto as moto_pkg

        from tierd import __version__
        result: dict[str, Any] = {
            "inputs": {k: str(v) for k, v in vars(args).items()},
            "versions": {"tierd": __version__, "python": sys.version.split()[0],
                         "boto3": boto3.__version__, "moto": moto_pkg.__version__,
                         "aiohttp": aiohttp.__version__},
            "machine": {"nproc": os.cpu_count(), "platform": platform.platform(),
                        "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
            "note": "warm GETs (page cache / moto memory); rates: MiB/s or objects/s; "
                    "ratios are tierd's rate over the baseline's (> 1: tierd faster); the "
                    "client (boto3, this process) and the server share the cores",
        }
        t, procs = args.threads, args.procs
        plan: list[tuple[str, list[Server], Callable[[Server], dict[str, Any]], str]] = [
            ("large_put", [moto, disk, null], lambda s: large_put(s, data), "MiB_per_s"),
            ("large_get", [static, moto], lambda s: large_get(s, data), "MiB_per_s"),
            ("large_get_stream", [static], lambda s: large_get_stream(s, data), "MiB_per_s"),
            ("small_put", [moto, null], lambda s: small_ops(
                s, data, "put", procs, t, small_prefix(s, args.small_overwrite)), "ops_per_s"),
            ("small_get", [static, moto], lambda s: small_ops(s, data, "get", procs, t),
             "ops_per_s"),
        ]
        for name, baselines, fn, rate in plan:
            if not only or name in only:
                result[name] = run_pairs(name, args.pairs, baselines, tierd, fn, rate)
        if args.rss_streams and (not only or "rss" in only):
            moto.stop()  # its memory is not under test; free it for the 8 GiB of data
            result["rss"] = rss_experiment(tierd, data, args.rss_streams)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    finally:
        for s in started:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
