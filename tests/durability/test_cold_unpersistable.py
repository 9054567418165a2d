"""A file whose cold key the store cannot take is that file's problem only.

A 4 KiB-deep path (each directory name 250 bytes, created through the FUSE mount one level
at a time) is a valid name in tierd but more than a ``file://`` cold store's file system
takes (ENAMETOOLONG).  The persister must not loop on it: a capped back-off, a handful of
log lines, the file named as unpersistable in the status and by ``persist --wait``, and
the cold store reachable -- every other file is persisted as usual.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .coldlib import Cold, Tierd, running

BUCKET = "cunp"
SEG = "d" * 250


def _deep_dir(top: Path, depth: int) -> int:
    """A descriptor on ``top/SEG/SEG/...`` (``depth`` levels), made level by level: no path
    handed to the kernel is ever longer than one name."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        with contextlib.suppress(FileExistsError):
            os.mkdir(SEG, dir_fd=fd)
        nfd = os.open(SEG, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def test_a_key_the_store_refuses_is_unpersistable_not_an_outage(tmp_path: Path) -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    cold = Cold("file", tmp_path)
    t = Tierd(tmp_path, cold, mount=True, TIERD_LOG_LEVEL="info")
    with running(t):
        assert t.mnt is not None
        d = t.mnt / BUCKET
        d.mkdir()
        deep = _deep_dir(d, 17)
        f = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=deep)
        os.write(f, b"deep bytes")
        os.close(f)
        key = "/".join([SEG] * 17 + ["f"])
        assert len(f"{cold.root}/{BUCKET}/{key}") > 4096
        ok = {f"ok{i}": os.urandom(10_000) for i in range(5)}
        for name, data in ok.items():
            (d / name).write_bytes(data)
        time.sleep(8)  # the old persister failed ~400 times a second here
        for name, data in ok.items():  # everyone else is persisted
            assert cold.get(f"{BUCKET}/{name}") == data
        for name in ok:
            assert t.persist_wait(f"{BUCKET}/{name}", timeout=10)["persisted"]
        assert t.cold_tier()["reachable"] is True
        status = t.status()["placement"]
        queue = status["queue"]
        assert queue["unpersistable"] == 1, queue
        bad = queue["unpersistable_files"][0]
        assert bad["key"] == f"{BUCKET}/{key}" and "KeyRejected" in bad["error"], bad
        assert status["stats"].get("persist_failures", 0) <= 3
        doc = t.persist_wait(BUCKET + "/", timeout=30)  # answers at once, naming it
        assert doc["persisted"] is False
        assert [f["key"] for f in doc["unpersistable"]] == [f"{BUCKET}/{key}"]
        # a persist job on it fails naming the file, and the daemon answers meanwhile (the
        # job's loop used to spin on the drain's immediate answer, holding the event loop)
        job = t.admin("POST", "/v1/jobs", {"kind": "persist", "prefix": BUCKET + "/"},
                      timeout=10)
        deadline = time.monotonic() + 30
        while job["state"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.05)
            job = t.admin("GET", f"/v1/jobs/{job['id']}", timeout=5)
        assert job["state"] == "failed", job
        assert "cannot be persisted" in job["error"] and f"{BUCKET}/{key}" in job["error"], job
        shown = subprocess.run(  # tierctl status names it, with the error
            [sys.executable, "-m", "tierd_client.tierctl", "--data-dir", str(t.data_dir),
             "status"], capture_output=True, text=True, timeout=60, check=True,
            env={**os.environ, "COLUMNS": "400"}).stdout
        assert "unpersistable" in shown and "KeyRejected" in shown, shown
        lines = [x for x in t.log.splitlines() if "persist" in x and SEG[:40] in x]
        assert 1 <= len(lines) <= 3, lines
        assert "OverflowError" not in t.log and "Traceback" not in t.log
        assert "unreachable" not in t.log
        # renamed to a key the store takes: tried again at once, and persisted
        top = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        os.rename("f", "moved", src_dir_fd=deep, dst_dir_fd=top)
        os.close(top)
        os.close(deep)
        assert t.persist_wait(BUCKET + "/", timeout=10)["persisted"]
        assert cold.get(f"{BUCKET}/moved") == b"deep bytes"
        assert t.status()["placement"]["queue"]["unpersistable"] == 0
    assert os.path.getsize(t.log_path) < 1 << 20
