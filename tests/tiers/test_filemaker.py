"""The helper process that makes the hot tier's spare data files (``tierd.tiers.filemaker``):
it makes what ``LocalTier.open_file`` would, reports the first failure, is replaced by the
daemon's own thread when it dies, and never outlives the daemon."""

from __future__ import annotations

import errno
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tierd.tiers import filemaker
from tierd.tiers.filemaker import FileMaker
from tierd.tiers.local_tier import LocalTier


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a child of this process stays a zombie until reaped: count that as gone
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.02)
    return False


@pytest.fixture
def maker() -> FileMaker:
    m = FileMaker()
    yield m
    m.close()


def test_the_helper_makes_empty_private_files_and_keeps_existing_ones(
        tmp_path: Path, maker: FileMaker) -> None:
    (tmp_path / "aa").mkdir()
    kept = tmp_path / "aa" / "kept"
    kept.write_bytes(b"data")
    paths = [tmp_path / "aa" / "one", tmp_path / "bb" / "two", kept]  # bb/ is missing
    assert maker.make([os.fsencode(p) for p in paths]) == 3
    assert maker.pid is not None and maker.pid != os.getpid()
    for p in paths[:2]:
        st = p.stat()
        assert st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o600 & ~_umask()
    assert kept.read_bytes() == b"data"  # an existing file is left as it is
    pid = maker.pid
    assert maker.make([os.fsencode(tmp_path / "aa" / "three")]) == 1
    assert maker.pid == pid  # one helper for every batch
    assert (tmp_path / "aa" / "three").exists()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_the_first_failure_stops_the_batch_and_is_reported(
        tmp_path: Path, maker: FileMaker, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_bytes(b"")
    bad = os.fsencode(tmp_path / "file" / "x")  # under a regular file: ENOTDIR
    ok = [os.fsencode(tmp_path / "d" / f"f{i}") for i in range(3)]
    with caplog.at_level(logging.WARNING, "tierd.tiers"):
        assert maker.make([ok[0], bad, ok[1]]) == 1
    assert "Not a directory" in caplog.text
    assert os.path.exists(ok[0]) and not os.path.exists(ok[1])
    with pytest.raises(OSError) as e:
        maker.make([bad, ok[2]])
    assert e.value.errno == errno.ENOTDIR and not os.path.exists(ok[2])
    assert maker.pid is not None  # a failed path is not a failed helper


def test_a_dead_helper_is_replaced_by_the_thread_then_started_again(
        tmp_path: Path, maker: FileMaker, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert maker.make([os.fsencode(tmp_path / "a")]) == 1
    first = maker.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    assert _gone(first)
    with caplog.at_level(logging.WARNING, "tierd.tiers"):
        assert maker.make([os.fsencode(tmp_path / "b"), os.fsencode(tmp_path / "c")]) == 2
    assert (tmp_path / "b").exists() and (tmp_path / "c").exists()
    assert "not running" in caplog.text
    assert maker.pid is None  # not restarted within RESTART seconds
    assert maker.make([os.fsencode(tmp_path / "d")]) == 1 and maker.pid is None
    with pytest.raises(OSError) as e:  # the thread reports a failure as the helper does
        maker.make([os.fsencode(tmp_path / "d" / "under-a-file")])
    assert e.value.errno == errno.ENOTDIR
    monkeypatch.setattr(filemaker, "RESTART", 0.0)
    assert maker.make([os.fsencode(tmp_path / "e")]) == 1
    second = maker.pid
    assert second is not None and second != first
    caplog.clear()  # a helper that worked again and dies again is reported again
    os.kill(second, signal.SIGKILL)
    assert _gone(second)
    with caplog.at_level(logging.WARNING, "tierd.tiers"):
        assert maker.make([os.fsencode(tmp_path / "f")]) == 1
    assert "not running" in caplog.text and (tmp_path / "f").exists()


def test_close_ends_the_helper_and_later_files_are_made_here(
        tmp_path: Path) -> None:
    m = FileMaker()
    assert m.make([os.fsencode(tmp_path / "a")]) == 1
    pid = m.pid
    assert pid is not None
    m.close()
    assert _gone(pid) and m.pid is None
    assert m.make([os.fsencode(tmp_path / "b")]) == 1 and m.pid is None
    assert (tmp_path / "b").exists()


def test_the_helper_exits_when_the_daemon_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the process that started it: the helper's input ends and it exits."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from tierd.tiers.filemaker import FileMaker
        m = FileMaker()
        assert m.make([os.fsencode({str(tmp_path / "x")!r})]) == 1
        print(m.pid, flush=True)
        time.sleep(60)
    """)
    daemon = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert daemon.stdout is not None
    helper = int(daemon.stdout.readline())
    assert (tmp_path / "x").exists()
    daemon.kill()
    daemon.wait()
    assert _gone(helper)


def test_local_tier_make_files_counts_them_as_new_for_the_next_fsync(
        tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "hot")
    try:
        assert tier.make_files([0x1234, 0x1235]) == [0x1234, 0x1235]
        for ino in (0x1234, 0x1235):
            assert os.path.getsize(tier.path(ino)) == 0
            assert ino in tier._new  # its directory entry is synced at its first fsync
        assert tier.inventory() == {0x1234, 0x1235}
    finally:
        tier._maker.close()
