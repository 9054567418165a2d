"""Unlinks of persisted files through the FUSE mount and the cold deletes they leave, before
and after a change, on one machine state.

``fuse_fio.py --only meta`` unlinks files a moment after creating them: with the default
persist delay most were never uploaded and leave no cold delete.  Here every file is
persisted first (admin ``persist``, which waits), so each unlink leaves a pending delete for
the daemon's delete worker (``tierd/placement/deletes.py``).  Per run: ``unlink_per_s``
(the unlink syscalls of ``--files`` files, one process), ``drain_s`` (from the last unlink
until the daemon reports no delete pending: the cold deletes done), and the daemon's CPU per
unlink over both: ``loop_cpu_ms`` (its main thread: the event loop) and ``proc_cpu_ms`` (all
its threads).

Daemons: ``new`` runs the tierd importable here; ``--base DIR`` adds ``base``, whose
``tierd`` and ``tierd_fuse`` packages come from DIR (``git archive REV tierd fuse | tar -x
-C DIR`` then ``mv DIR/fuse DIR/tierd_fuse``).  Runs alternate (new base, base new, ...)
``--pairs`` times; medians per daemon.  ``--cold s3`` puts both cold tiers on a moto server
(tests/moto_server.py) over HTTP, each under its own prefix; ``file`` (the default) on the
data directory's disk.  Results: JSON on stdout and in ``--out``.

    .venv/bin/python bench/unlink_deletes.py --files 3000 --pairs 3 --base /tmp/old
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchlib import admin_call
from fuse_fio import DATA_DIR, start_daemon

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def thread_cpu(pid: int, tid: int) -> float:
    """CPU seconds of thread ``tid`` of process ``pid`` (``tid == pid``: the main thread,
    the event loop's; ``tid == 0``: the whole process)."""
    path = f"/proc/{pid}/stat" if tid == 0 else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def persist_wait(admin: str) -> None:
    doc = admin_call(admin, DATA_DIR[admin], "POST", "/v1/placement/persist",
                     {"prefix": "", "timeout": 600}, timeout=620)
    if not doc.get("persisted"):
        raise RuntimeError(f"persist did not finish: {doc}")


def one_run(pid: int, admin: str, mnt: Path, n: int, tag: str) -> dict[str, Any]:
    d = mnt / "bench" / tag
    d.mkdir(parents=True)
    names = [d / f"f{i:06d}" for i in range(n)]
    for p in names:
        p.write_bytes(b"x")
    persist_wait(admin)
    os.sync()
    loop0, proc0 = thread_cpu(pid, pid), thread_cpu(pid, 0)
    t0 = time.perf_counter()
    for p in names:
        os.unlink(p)
    t1 = time.perf_counter()
    persist_wait(admin)  # returns once no delete is pending
    t2 = time.perf_counter()
    loop1, proc1 = thread_cpu(pid, pid), thread_cpu(pid, 0)
    d.rmdir()
    return {"unlink_per_s": round(n / (t1 - t0), 1), "drain_s": round(t2 - t1, 3),
            "loop_cpu_ms": round((loop1 - loop0) / n * 1000, 4),
            "proc_cpu_ms": round((proc1 - proc0) / n * 1000, 4)}


@contextlib.contextmanager
def cold_store(kind: str) -> Iterator[Any]:
    if kind == "file":
        yield None
        return
    from moto_server import running_moto

    with running_moto() as server:
        server.client().create_bucket(Bucket="bench-cold")
        yield server


def cold_args(server: Any) -> list[str]:
    if server is None:
        return []
    from moto_server import ACCESS_KEY, REGION, SECRET_KEY

    return ["--cold-url", f"s3://bench-cold/{uuid.uuid4().hex[:8]}",
            "--cold-s3-endpoint", server.url, "--cold-s3-region", REGION,
            "--cold-s3-access-key", ACCESS_KEY, "--cold-s3-secret-key", SECRET_KEY,
            "--cold-s3-addressing", "path"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--base", default=None, metavar="DIR",
                    help="the earlier tree: DIR/tierd and DIR/tierd_fuse")
    ap.add_argument("--cold", choices=("file", "s3"), default="file")
    ap.add_argument("--backend", choices=("kernel", "pyfuse3"), default="kernel")
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--out", default=str(HERE / "results" / "unlink_deletes.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tierd-bench-unlink-"))
    labels = ["new", *(["base"] if args.base else [])]
    daemons: dict[str, tuple[subprocess.Popen[bytes], Path, Path, str | None]] = {}
    runs: dict[str, list[dict[str, Any]]] = {lb: [] for lb in labels}
    load = [os.getloadavg()]
    with cold_store(args.cold) as server:
        try:
            for lb in labels:
                (work / lb).mkdir()
                extra = [*args.serve_arg, "--fuse-backend", args.backend, *cold_args(server)]
                daemons[lb] = start_daemon(work / lb, extra,
                                           args.base if lb == "base" else None)
            for i in range(args.pairs):
                for lb in labels if i % 2 == 0 else labels[::-1]:
                    proc, _, mnt, admin = daemons[lb]
                    assert admin is not None
                    r = one_run(proc.pid, admin, mnt, args.files, f"r{i}")
                    runs[lb].append(r)
                    print(f"round {i} {lb}: {r}", flush=True)
                load.append(os.getloadavg())
        finally:
            for proc, *_ in daemons.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _, mnt, _ in daemons.values():
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
    summary = {lb: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for lb, rs in runs.items() if rs}
    doc = {"benchmark": "unlink_deletes", "inputs": vars(args), "load_average": load,
           "runs": runs, "median": summary}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"median": summary, "load_average": load}, indent=2))
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
