"""The mount's life cycle: clean unmount, a stale mount after kill -9, a busy mount point,
``tierd mount``/``tierd umount``, an unmount from outside, and ENOSPC from a full tier.

Each test runs its own daemon (the session daemon of the other tests stays untouched).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import clean_env, start_daemon, stop_daemon
from tierd_fuse.mount import find_mount, unmount

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def place(public_tmp: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    d = public_tmp / f"life-{request.node.name}"
    d.mkdir()
    yield d
    mnt = d / "mnt"
    if find_mount(mnt) is not None:
        unmount(mnt, lazy=True)


def test_sigterm_unmounts_cleanly_and_data_persists(place: Path) -> None:
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        (d.mnt / "bkt").mkdir()
        (d.mnt / "bkt" / "f").write_bytes(b"durable")
    finally:
        code = stop_daemon(d)
    assert code == 0, d.log
    assert find_mount(d.mnt) is None
    assert "unmounted" in d.log
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        assert (d.mnt / "bkt" / "f").read_bytes() == b"durable"
    finally:
        assert stop_daemon(d) == 0


def test_sigterm_on_a_busy_mount_detaches_it(place: Path) -> None:
    """A process working inside the mount makes it busy: the daemon's plain unmount fails,
    it ends the session and detaches the mount (lazily), and exits cleanly; what was
    written before stays."""
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        (d.mnt / "bkt").mkdir()
        (d.mnt / "bkt" / "f").write_bytes(b"held")
        busy = subprocess.Popen(["sleep", "60"], cwd=d.mnt / "bkt")
        try:
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(60) == 0, d.log
            assert find_mount(d.mnt) is None, d.log
        finally:
            busy.kill()
            busy.wait()
    finally:
        stop_daemon(d)
    assert "detaching the mount" in d.log and "unmounted" in d.log
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        assert (d.mnt / "bkt" / "f").read_bytes() == b"held"
    finally:
        assert stop_daemon(d) == 0


def test_stale_mount_after_kill_is_cleared_at_next_start(place: Path) -> None:
    d = start_daemon(place / "data", place / "mnt", place / "log")
    (d.mnt / "bkt").mkdir()
    (d.mnt / "bkt" / "f").write_bytes(b"before the crash")
    d.proc.kill()
    d.proc.wait(10)
    assert find_mount(d.mnt) is not None  # the kernel keeps a dead mount
    with pytest.raises(OSError) as exc:
        os.statvfs(d.mnt)  # (a stat of the root may be answered from the kernel's cache)
    assert exc.value.errno == errno.ENOTCONN
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        assert "clearing stale mount" in d.log
        assert (d.mnt / "bkt" / "f").read_bytes() == b"before the crash"
    finally:
        assert stop_daemon(d) == 0


def test_kill_in_a_lease_then_quick_start(place: Path) -> None:
    """A passthrough writer's release takes a write lease on the hot file and gives it back
    (fuse/files.py ``written_elsewhere``); killed in between, the daemon leaves the lease
    on a backing file the dead mount keeps.  The next start's recovery opens that file (the
    ``V`` intention of a kernel writer: ``HotDir.detach``): with the dead mount still there,
    the open waited the kernel's lease-break-time (45 s) and the start failed its 30 s.  The
    stale mount is cleared before the namespace loads."""
    if os.environ.get("TIERD_FUSE_PASSTHROUGH_WRITES", "true") == "false":
        pytest.skip("write passthrough is off")
    d = start_daemon(place / "data", place / "mnt", place / "log", crashpoint="pt.lease")
    (d.mnt / "bkt").mkdir()
    (d.mnt / "bkt" / "f").write_bytes(b"written through the kernel")
    assert d.proc.wait(20) == -signal.SIGKILL, d.log  # at the release's lease
    t0 = time.monotonic()
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        took = time.monotonic() - t0
        log = d.log
        assert log.index("clearing stale mount") < log.index("not closed cleanly"), log
        assert took < 25, f"the start took {took:.1f} s"
        assert (d.mnt / "bkt" / "f").read_bytes() == b"written through the kernel"
    finally:
        assert stop_daemon(d) == 0


def test_second_mount_on_busy_mount_point_fails_clearly(place: Path) -> None:
    first = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tierd.cli", "serve", "--data-dir", str(place / "data2"),
             "--mount", str(first.mnt), "--s3-listen", "127.0.0.1:0",
             "--admin-listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=60, env=clean_env(),
            stdin=subprocess.DEVNULL)
        assert r.returncode == 1
        assert "is busy" in r.stderr and "tierd umount" in r.stderr, r.stderr
        (first.mnt / "still-works").mkdir()  # the first mount is untouched
    finally:
        assert stop_daemon(first) == 0


def test_tierd_mount_and_umount_commands(place: Path) -> None:
    mnt = place / "mnt"
    args = ["--data-dir", str(place / "data"), "--s3-listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0"]
    cmd = [sys.executable, "-m", "tierd.cli"]
    r = subprocess.run([*cmd, "mount", str(mnt), *args], capture_output=True, text=True,
                       timeout=60, env=clean_env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert "mounted" in r.stdout
    pid = int(r.stdout.split("pid ")[1].split(",")[0])
    try:
        (mnt / "bkt").mkdir()
        (mnt / "bkt" / "f").write_text("via tierd mount")
        again = subprocess.run([*cmd, "mount", str(mnt), *args], capture_output=True,
                               text=True, timeout=60, env=clean_env())
        assert again.returncode == 1 and "busy" in again.stderr
        r = subprocess.run([*cmd, "umount", str(mnt)], capture_output=True, text=True,
                           timeout=60, env=clean_env())
        assert r.returncode == 0, r.stderr
        assert find_mount(mnt) is None
        deadline = time.monotonic() + 20
        while _alive(pid):  # the daemon stops once its mount is gone
            assert time.monotonic() < deadline, "daemon did not stop after tierd umount"
            time.sleep(0.05)
        r = subprocess.run([*cmd, "umount", str(mnt)], capture_output=True, text=True,
                           timeout=60, env=clean_env())
        assert r.returncode == 1 and "not mounted" in r.stderr
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_mount_beside_a_tierd_dir(place: Path) -> None:
    """The detached daemon must not import a ``./tierd`` of the caller's directory, and
    ``mount`` (util-linux) must not show ``$PWD/tierd`` as the mount's source."""
    cwd = place / "work"
    (cwd / "tierd").mkdir(parents=True)
    (cwd / "tierd" / "__init__.py").write_text("raise ImportError('the wrong tierd')\n")
    (cwd / "tierd" / "cli.py").write_text("raise SystemExit('the wrong tierd')\n")
    tierd = Path(sys.executable).parent / "tierd"  # the console script a user runs
    args = ["--data-dir", str(place / "data"), "--s3-listen", "127.0.0.1:0",
            "--admin-listen", "127.0.0.1:0"]
    r = subprocess.run([str(tierd), "mount", "mnt-rel", *args], capture_output=True,
                       text=True, timeout=60, env=clean_env(), stdin=subprocess.DEVNULL,
                       cwd=cwd)
    rel = cwd / "mnt-rel"
    try:
        assert r.returncode == 0, (r.stdout, r.stderr)
        (rel / "bkt").mkdir()
        listed = subprocess.run(["mount"], capture_output=True, text=True, cwd=cwd,
                                check=True).stdout
        line = next(x for x in listed.splitlines() if f" on {rel} " in x)
        assert line.split(" on ")[0] != str(cwd / "tierd"), line
        assert not line.split(" on ")[0].startswith("/"), line
    finally:
        subprocess.run([str(tierd), "umount", str(rel)], capture_output=True, timeout=60,
                       env=clean_env())
        if find_mount(rel) is not None:
            unmount(rel, lazy=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of an exited daemon (its parent, tierd mount, is gone: init reaps it)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_unmount_from_outside_keeps_the_daemon_serving(place: Path) -> None:
    d = start_daemon(place / "data", place / "mnt", place / "log")
    try:
        unmount(d.mnt)
        deadline = time.monotonic() + 10
        while "went away" not in d.log:
            assert time.monotonic() < deadline, d.log
            time.sleep(0.05)
        assert d.proc.poll() is None  # still serving its other doors
    finally:
        assert stop_daemon(d) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_tier_gives_enospc(place: Path) -> None:
    hot = place / "hot"
    hot.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(hot)], check=True)
    try:
        d = start_daemon(place / "data", place / "mnt", place / "log", "--hot-dir", str(hot))
        try:
            (d.mnt / "bkt").mkdir()
            with pytest.raises(OSError) as exc, open(d.mnt / "bkt" / "big", "wb") as f:
                for _ in range(8):
                    f.write(b"x" * (1 << 20))
                    f.flush()
            assert exc.value.errno == errno.ENOSPC
            os.unlink(d.mnt / "bkt" / "big")
            # the space comes back at the file's last release, which the kernel sends
            # asynchronously after close
            deadline = time.monotonic() + 10
            while True:
                try:
                    (d.mnt / "bkt" / "small").write_bytes(b"fits")
                    break
                except OSError as e:
                    assert e.errno == errno.ENOSPC and time.monotonic() < deadline
                    time.sleep(0.1)
            assert (d.mnt / "bkt" / "small").read_bytes() == b"fits"
        finally:
            assert stop_daemon(d) == 0
    finally:
        subprocess.run(["umount", "-l", str(hot)], check=False)
