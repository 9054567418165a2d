"""A mount attached to a running daemon (``/v1/mounts``, ``tierctl mount``): with a daemon
serving, ``tierd serve --mount`` on the same data is refused (the data directory is locked),
so the running daemon mounts its own namespace.  Real FUSE mounts, real programs reading
through them, real S3 clients writing."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Admin, start_admin

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")


def mounted_at(path: Path) -> bool:
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Admin]:
    a = start_admin(tmp_path / "data")
    yield a
    a.d.stop()
    assert "Traceback" not in a.log(), a.log()[-5000:]


def test_tierctl_mount_add_serves_what_s3_wrote_and_rm_unmounts(live: Admin,
                                                                tmp_path: Path) -> None:
    s3 = live.d.client()
    s3.create_bucket(Bucket="shared")
    s3.put_object(Bucket="shared", Key="dir/hello.txt", Body=b"through both doors\n")
    mnt = tmp_path / "mnt"  # missing: tierctl creates it (the daemon is on this machine)

    r = live.tierctl("mount", "add", str(mnt))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"mounted at {mnt}")
    assert mounted_at(mnt)
    # a real program reads what S3 wrote; S3 reads what the mount wrote
    cat = subprocess.run(["cat", str(mnt / "shared" / "dir" / "hello.txt")],
                         capture_output=True, timeout=30)
    assert cat.returncode == 0 and cat.stdout == b"through both doors\n"
    (mnt / "shared" / "dir" / "back.txt").write_bytes(b"from the mount")
    assert s3.get_object(Bucket="shared", Key="dir/back.txt")["Body"].read() == \
        b"from the mount"
    status, doc = live.call("GET", "/v1/mounts")
    assert status == 200 and doc == {"mounts": [{"door": "fuse", "mountpoint": str(mnt),
                                                 "source": "/"}]}
    listed = live.tierctl("mount", "list")
    assert listed.returncode == 0 and str(mnt) in listed.stdout
    st = live.call("GET", "/v1/status")[1]
    assert st["mount"] == str(mnt)

    r = live.tierctl("mount", "rm", str(mnt))
    assert r.returncode == 0 and r.stdout == f"unmounted {mnt}\n", r.stderr
    assert not mounted_at(mnt)
    assert os.listdir(mnt) == []  # the plain directory again
    assert live.call("GET", "/v1/mounts")[1] == {"mounts": []}
    r = live.tierctl("mount", "list")
    assert r.returncode == 0 and r.stdout.startswith("no mount")
    # and again: one FUSE session per process, but a new one after the old one ended
    r = live.tierctl("mount", "add", str(mnt))
    assert r.returncode == 0, r.stderr
    assert (mnt / "shared" / "dir" / "back.txt").read_bytes() == b"from the mount"
    r = live.tierctl("mount", "rm", str(mnt))
    assert r.returncode == 0, r.stderr


def test_mount_requests_that_are_refused_say_why(live: Admin, tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = [
        ({"mountpoint": "relative/dir"}, 400, "absolute path"),
        ({"mountpoint": str(tmp_path / "missing")}, 400, "does not exist"),
        ({"mountpoint": str(full)}, 400, "not empty"),
        ({"mountpoint": str(full / "keep.txt")}, 400, "not a directory"),
        ({"mountpoint": "/tmp/a\x00b"}, 400, "absolute path"),
        ({"dir": "/x"}, 400, "mountpoint"),
        ([], 400, "mountpoint"),
    ]
    for body, status, text in cases:
        got, doc = live.call("POST", "/v1/mounts", body)
        assert got == status and text in doc["message"], (body, got, doc)
    assert (full / "keep.txt").read_text() == "mine" and not mounted_at(full)
    assert not (tmp_path / "missing").exists()  # the API creates no directories

    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    status, doc = live.call("POST", "/v1/mounts", {"mountpoint": str(one)})
    assert status == 201 and doc["mountpoint"] == str(one), doc
    try:
        status, doc = live.call("POST", "/v1/mounts", {"mountpoint": str(two)})
        assert status == 409 and doc["error"] == "mount_refused"
        assert str(one) in doc["message"] and not mounted_at(two)
        status, doc = live.call("DELETE", f"/v1/mounts?mountpoint={two}")
        assert status == 404 and doc["error"] == "not_mounted" and str(one) in doc["message"]
        r = live.tierctl("mount", "rm", str(two))
        assert r.returncode == 1 and "no mount at" in r.stderr and r.stdout == ""
    finally:
        status, doc = live.call("DELETE", f"/v1/mounts?mountpoint={one}")
    assert status == 200 and doc == {"mountpoint": str(one), "unmounted": True}
    assert not mounted_at(one)


def test_a_mount_attached_at_run_time_is_unmounted_at_shutdown(tmp_path: Path) -> None:
    a = start_admin(tmp_path / "data")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        status, doc = a.call("POST", "/v1/mounts", {"mountpoint": str(mnt)})
        assert status == 201, doc
        assert mounted_at(mnt)
    finally:
        a.d.stop()
    assert a.d.proc.returncode == 0, a.log()[-3000:]
    assert not mounted_at(mnt), "the daemon left its mount behind"


def test_a_mount_attached_at_run_time_is_cleared_at_the_next_start_after_a_kill(
        tmp_path: Path) -> None:
    """A daemon killed with a mount attached through the API leaves a dead mount (every
    access: ENOTCONN).  The next start on the same data clears it, as it clears the
    ``mount`` setting's (the endpoints.json the dead daemon left names it); a mount point
    something else serves by then is left alone."""
    a = start_admin(tmp_path / "data")
    mnt, other = tmp_path / "mnt", tmp_path / "other"
    mnt.mkdir()
    other.mkdir()
    try:
        status, doc = a.call("POST", "/v1/mounts", {"mountpoint": str(mnt)})
        assert status == 201, doc
    finally:
        a.d.proc.kill()
        a.d.proc.wait(10)
    assert mounted_at(mnt), "the kernel keeps a dead mount"
    with pytest.raises(OSError) as exc:
        os.statvfs(mnt)
    assert exc.value.errno == errno.ENOTCONN
    b = start_admin(tmp_path / "data")
    try:
        assert not mounted_at(mnt), "the dead mount was left behind"
        assert "clearing stale mount" in b.log()
        status, doc = b.call("POST", "/v1/mounts", {"mountpoint": str(other)})
        assert status == 201, doc
    finally:
        b.d.proc.kill()
        b.d.proc.wait(10)
    c = start_admin(tmp_path / "data2")  # another data directory: not its mount to clear
    try:
        assert mounted_at(other)
    finally:
        c.d.stop()
    d = start_admin(tmp_path / "data")
    try:
        assert not mounted_at(other)
    finally:
        d.d.stop()
    assert d.d.proc.returncode == 0, d.log()[-3000:]


def test_a_second_tierd_with_mount_is_refused_and_points_at_tierctl(live: Admin,
                                                                   tmp_path: Path) -> None:
    """What the README used to tell users to do: start `tierd serve --mount` beside the
    running daemon.  It is refused (the data directory is locked), and says what works."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERD_")}
    r = subprocess.run([sys.executable, "-m", "tierd.cli", "serve", "--data-dir",
                        str(live.data), "--mount", str(tmp_path / "m"), "--s3-listen",
                        "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "already running" in r.stderr and "tierctl mount add" in r.stderr, r.stderr
