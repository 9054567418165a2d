"""kill -9 of the daemon while programs create, write and fsync files through FUSE write
passthrough (fuse/kpass.py), the default mount.

A passthrough CREATE commits the new file and its kernel-marked ``V`` intention in one
metadata transaction and replies without waiting for a flush (``FileOps.create``,
``TieringOps.passthrough_open``).  The rules that make that safe, checked here end to end
with real processes, a real mount and SIGKILL at random moments:

* every file whose ``fsync`` or ``close`` returned (the workers' journal, written only
  after the acknowledgement) reads back exact after the restart, through the mount and S3;
  one acknowledged by ``fsync`` and then written on without acknowledgement starts with
  the acknowledged bytes;
* the workers go on writing their open files after the new daemon started (a FUSE backing
  file outlives its daemon), over the acknowledged bytes: those writes never reach what the
  new daemon serves -- whether the
  crash kept the file (the start gives it a data file of its own) or lost its create (its
  data file, under a number the start never hands out again, is removed as no inode's) --
  nor the files created after the restart.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .coldlib import Cold, Tierd

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/fuse"),
                       reason="needs root and FUSE (the kernel backend's passthrough)"),
]

BUCKET = "ptkill"
ROUNDS = 3
WORKERS = 3

_WORKER = r"""
import hashlib, os, random, sys, time
d, journal, wid, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(seed)
jfd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
held = []  # descriptors kept open after their last acknowledgement (or none)

def note(kind, name, data):
    os.write(jfd, f"{kind} {name} {hashlib.sha256(data).hexdigest()} {len(data)}\n".encode())
    os.fsync(jfd)

i = 0
try:
    while True:
        name = f"{wid}-{i}"
        i += 1
        data = rng.randbytes(rng.choice([0, 1, 100, 4096, 65536, 300000]))
        fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        how = rng.choice(["fsync+close", "close", "fsync+keep", "keep"])
        if how == "keep":  # never acknowledged
            held.append(fd)
            continue
        if how.startswith("fsync"):
            os.fsync(fd)
        if how == "fsync+keep":
            note("prefix", name, data)
            held.append(fd)
        else:
            os.close(fd)
            # a file created and closed empty, never fsynced, acknowledged nothing
            note("exact" if data or how == "fsync+close" else "maybe", name, data)
        for h in held[-3:]:  # unacknowledged writes go on meanwhile
            os.write(h, b"W" * 1000)
except OSError:
    pass
print("daemon gone", flush=True)
sys.stdin.readline()  # the new daemon started (what is written before may count)
while True:  # the kernel lets passthrough writers write on after their daemon died:
    for h in held:  # over the acknowledged bytes, which must not change any more
        try:
            os.pwrite(h, b"Z" * 4096, 0)
        except OSError:
            pass
    time.sleep(0.01)
"""


def _journal(path: Path) -> list[tuple[str, str, str, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        kind, name, sha, size = line.split()
        out.append((kind, name, sha, int(size)))
    return out


def _check(t: Tierd, d: Path, entries: list[tuple[str, str, str, int]],
           prefix: str) -> dict[str, bytes]:
    """Every journaled file as the acknowledgement says, through the mount and S3; the
    bytes the mount served, by name."""
    s3 = t.s3()
    seen: dict[str, bytes] = {}
    for kind, name, sha, size in entries:
        f = d / name
        if kind == "maybe":
            assert not f.exists() or f.read_bytes() == b"", name
            continue
        body = f.read_bytes()
        head = body if kind == "exact" else body[:size]
        assert len(body) >= size, f"{name}: {len(body)} bytes, {size} acknowledged"
        assert hashlib.sha256(head).hexdigest() == sha, f"{name}: acknowledged bytes differ"
        if kind == "exact":
            assert len(body) == size, name
        got = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{name}")["Body"].read()
        assert got == body, f"{name}: S3 and the mount differ"
        seen[name] = body
    return seen


def test_kill_9_during_concurrent_passthrough_creates(tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("PTKILL_SEED", str(time.time_ns())))
    cold = Cold("file", tmp_path)
    t = Tierd(tmp_path / "n", cold, mount=True, TIERD_FUSE_PASSTHROUGH="true",
              TIERD_FUSE_PASSTHROUGH_WRITES="true", TIERD_PERSIST_DELAY="60")
    t.start(60)
    assert t.mnt is not None
    mnt = t.mnt
    (mnt / BUCKET).mkdir()
    zombies: list[subprocess.Popen[str]] = []
    try:
        for r in range(ROUNDS):
            d = mnt / BUCKET / f"r{r}"
            d.mkdir()
            journal = tmp_path / f"journal-{r}"
            workers = [subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(d), str(journal), f"w{w}",
                 str(rng.randrange(1 << 30))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True)
                for w in range(WORKERS)]
            zombies += workers
            time.sleep(rng.uniform(0.4, 2.0))
            t.kill9()
            for w in workers:  # each saw the daemon go (a create failed)
                assert w.stdout is not None
                assert w.stdout.readline().strip() == "daemon gone"
            t.start(60)
            for w in workers:  # the old writers overwrite their files from now on
                assert w.stdin is not None
                w.stdin.write("go\n")
                w.stdin.flush()
            entries = _journal(journal)
            assert sum(k != "maybe" for k, *_ in entries) >= 5, "too few acknowledged"
            seen = _check(t, d, entries, f"r{r}")
            # files created after the restart, while the old writers still write theirs
            fresh = {f"n{i}": os.urandom(rng.choice([1, 5000, 200000])) for i in range(20)}
            for name, data in fresh.items():
                with open(d / name, "wb") as f:
                    f.write(data)
                    os.fsync(f.fileno())
            time.sleep(0.5)
            for name, data in fresh.items():
                assert (d / name).read_bytes() == data, name
            for name, body in seen.items():
                assert (d / name).read_bytes() == body, f"{name} changed after the restart"
            assert _check(t, d, entries, f"r{r}") == seen
    finally:
        for z in zombies:
            z.send_signal(signal.SIGKILL)
            z.wait(30)
        t.stop()
