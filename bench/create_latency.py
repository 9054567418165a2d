"""One client's creates through a single node's FUSE mount, timed from the client: what an
``open(O_CREAT)`` and a ``close`` cost, and the daemon's CPU per file, by thread.

``bench/fuse_fio.py --only meta`` measures the rate beside the raw disk, with one daemon per
variant mounted at once; while the second is measured, the first's persister is still
uploading (and, after the unlinks, deleting) that round's files.  This one starts a fresh
daemon for every round and stops it after, so a before/after (``--base TREE``: a ``git
archive`` of another revision with ``tierd_fuse`` linked to its ``fuse``, run from ``/tmp``
with ``PYTHONPATH=TREE``) alternates on an otherwise idle machine.  Default settings
(passthrough on, lmdb); per round ``--warmup`` files, then ``--files`` measured.  The daemon's
CPU comes from ``/proc/PID/task/*/stat`` around the measured files: the loop's (the main
thread's), the other threads' together and the child processes' (``helpers``); the
machine's inter-processor interrupts per file from ``/proc/interrupts``
(``ipis_per_create``: :func:`benchlib.ipis`).  After each
round the same number of empty files is made straight on the hot tier's file system
(``raw_creates_per_s``): the baseline of that round, since every create needs one such
file.  Prints one JSON document.

    cd /tmp && python /work/main/bench/create_latency.py --pairs 3 --base /tmp/base
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import emit, hot_fs, idle_state, ipis, self_cpu
from fuse_fio import start_daemon

from tierd.tiers.local_tier import LocalTier

TICK = os.sysconf("SC_CLK_TCK")
#: each round's directory, removed only after the last round: on an ext4 without a journal
#: the next round's new files would otherwise pass over every inode just freed
#: (:func:`benchlib.hot_fs`), and each round would pay for the one before
LEFT: list[Path] = []


def _children(pid: int) -> list[int]:
    """The child processes of every thread of ``pid`` (each thread lists those it started)."""
    out: list[int] = []
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
        except OSError:
            continue
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the process's main thread (the event loop's: ``loop``), of all its
    other threads together (``threads``) and of its child processes (``helpers``: the one
    that makes spare data files, tierd/tiers/filemaker.py)."""
    out = {"loop": 0.0, "threads": 0.0, "helpers": 0.0}
    for proc in [pid, *_children(pid)]:
        for t in os.listdir(f"/proc/{proc}/task") if os.path.exists(f"/proc/{proc}") else []:
            try:
                stat = Path(f"/proc/{proc}/task/{t}/stat").read_text()
            except OSError:
                continue  # the thread ended meanwhile
            fields = stat.rsplit(")", 1)[1].split()
            kind = "helpers" if proc != pid else "loop" if int(t) == pid else "threads"
            out[kind] += (int(fields[11]) + int(fields[12])) / TICK
    return out


def one_round(tree: str | None, args: argparse.Namespace) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="tierd-bench-create-"))
    proc, _, mnt, _ = start_daemon(base, ["--fuse-backend", "kernel", *args.serve_arg], tree)
    try:
        d = mnt / "bench" / "create"
        d.mkdir(parents=True)
        for i in range(args.warmup):
            os.close(os.open(d / f"w{i}", os.O_CREAT | os.O_WRONLY, 0o644))
        t_open = t_close = 0.0
        cpu0, irq0 = thread_cpu(proc.pid), ipis()
        t0 = time.perf_counter()
        for i in range(args.files):
            a = time.perf_counter()
            fd = os.open(d / f"f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644)
            b = time.perf_counter()
            os.close(fd)
            t_open += b - a
            t_close += time.perf_counter() - b
        elapsed = time.perf_counter() - t0
        cpu1, irq1 = thread_cpu(proc.pid), ipis()
        proc.terminate()
        proc.wait(60)
        raw = raw_creates(base / "raw", args.files)
    finally:
        if proc.poll() is None:  # (a clean stop unmounts)
            proc.terminate()
            proc.wait(60)
        LEFT.append(base)  # removed after the last round (see LEFT)
    n = args.files
    per_thread = {k: round((cpu1[k] - cpu0[k]) / n * 1e6) for k in cpu1}
    return {"creates_per_s": round(n / elapsed), "open_us": round(t_open / n * 1e6),
            "close_us": round(t_close / n * 1e6),
            "daemon_cpu_us_per_create": sum(per_thread.values()),
            "cpu_us_per_create": per_thread,
            "ipis_per_create": {k: round((irq1[k] - irq0[k]) / n, 2) for k in irq1}, **raw}


def raw_creates(root: Path, n: int) -> dict[str, int]:
    """The hot tier's file system alone, after the round: ``n`` empty files made as the hot
    tier makes its data files (``O_CREAT | O_EXCL``, 256 shard directories), and this
    process's CPU per file.  Each of tierd's creates needs one such file (its passthrough
    backing file), and the cost of a new file there has varied 20-fold on this VM, whose ext4
    has no journal (:func:`benchlib.hot_fs`)."""
    tier = LocalTier(root)  # (its layout: tier.path)
    for shard in range(256):  # its shard directories, made before the clock starts
        os.mkdir(os.path.dirname(tier.path(shard)))
    c0, t0 = self_cpu(), time.perf_counter()
    for i in range(n):
        os.close(os.open(tier.path(i + 1), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
    elapsed, cpu = time.perf_counter() - t0, self_cpu() - c0
    return {"raw_creates_per_s": round(n / elapsed), "raw_cpu_us_per_create": round(cpu / n * 1e6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--base", default=None, metavar="TREE",
                    help="also measure the daemons of this tree, alternating")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an argument for `tierd serve` (repeat: --serve-arg=--fuse-poll-us "
                    "--serve-arg=0)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.path.exists("tierd") and args.base:
        sys.exit("run from outside the checkout (cd /tmp): `python -m tierd.cli` would find "
                 "this checkout's tierd before --base's")
    runs: dict[str, list[dict[str, Any]]] = {"this": []}
    if args.base:
        runs["base"] = []
    try:
        for _ in range(args.pairs):
            runs["this"].append(one_round(None, args))
            if args.base:
                runs["base"].append(one_round(args.base, args))
    finally:
        for base in LEFT:
            shutil.rmtree(base, ignore_errors=True)
    result = {
        "bench": "create_latency", "files": args.files, "warmup": args.warmup,
        "serve_args": args.serve_arg, "idle": idle_state(),
        "hot_fs": hot_fs(Path(tempfile.gettempdir())),
        "base": args.base, "load_average": os.getloadavg(),
        "runs": runs,
        "median_creates_per_s": {k: statistics.median(r["creates_per_s"] for r in v)
                                 for k, v in runs.items()},
        "median_raw_creates_per_s": statistics.median(
            r["raw_creates_per_s"] for v in runs.values() for r in v),
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
