"""Crash safety of the lmdb engine: a killed process leaves exactly the last committed state.

Only lmdb: the memory engine keeps nothing once its process is gone.  Each scenario runs a
child Python process (``sys.executable -c``) against a store on disk and SIGKILLs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tierd
from tierd.meta import SCHEMA_VERSION, Dirent, MetaStore, MetaTxn

pytestmark = pytest.mark.timeout(120)

ROOT = Path(tierd.__file__).resolve().parent.parent
NFILES = 40  # inodes rewritten by every transaction: several lmdb pages per commit
PARENT = 1
S_IFREG = 0o100000

# Transaction n sets the counter "seq" to n, rewrites NFILES inodes with size = version = n
# and an xattr "n", adds the entry f<n> and drops f<n-3>; so every committed state is a pure
# function of n, and anything mixed from two transactions is detectable.
COMMIT_LOOP = """
import sys
from tierd.meta import Dirent, Inode, MetaStore

path, nfiles, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# commit: every commit is durable, so each one is reported; group: only what a sync
# covered is promised, so a report follows each sync
store = MetaStore.open_lmdb(path, sync=mode)
with store.read() as tx:
    n = tx.counter("seq")
while True:
    n += 1
    with store.write() as tx:
        assert tx.add_counter("seq", 1) == n
        for i in range(nfiles):
            ino = 100 + i
            tx.put_inode(Inode(ino=ino, mode=0o100644, uid=0, gid=0, size=n, version=n,
                               etag="%032x" % n, objmeta={"pad": "x" * 100}))
            tx.set_xattr(ino, b"user.n", b"%d" % n)
        tx.add_dirent(1, b"f%08d" % n, Dirent(n, 0o100000))
        if n > 3:
            assert tx.remove_dirent(1, b"f%08d" % (n - 3))
    if n % 64 == 0 or mode == "group" and n % 8 == 0:
        store.sync()  # a kill can land inside a sync too
    if mode == "commit" or n % 8 == 0:
        print(n, flush=True)
"""

# Commits a baseline, then holds a read transaction and an open write transaction full of
# changes until it is killed.
HOLD_OPEN_WRITE = """
import sys, time
from tierd.meta import Dirent, Inode, MetaStore

store = MetaStore.open_lmdb(sys.argv[1], sync="commit")  # a real lmdb write txn held open
with store.write() as tx:
    tx.add_counter("seq", 1)
    tx.put_inode(Inode(ino=100, mode=0o100644, uid=0, gid=0, size=1, version=1))
    tx.add_dirent(1, b"base", Dirent(100, 0o100000))
reader = store.read()
tx = store.write()
tx.add_counter("seq", 1)
tx.delete_inode(100)
tx.remove_dirent(1, b"base")
for ino in range(1000, 6000):
    tx.put_inode(Inode(ino=ino, mode=0o100644, uid=0, gid=0, size=ino, objmeta={"p": "y" * 200}))
    tx.add_dirent(1, b"ghost%d" % ino, Dirent(ino, 0o100000))
print("holding", flush=True)
time.sleep(600)
"""

# Opens the engine while the holder above is alive, then (on "go", after the holder was
# killed) takes the write lock the dead process held and commits.
SURVIVOR = """
import sys
from tierd.meta import Dirent, MetaStore
from tierd.meta.lmdb_engine import LmdbStore

engine = LmdbStore(sys.argv[1])
tx = engine.begin()
seen = tx.get(b"D" + (1).to_bytes(8, "big") + b"base") is not None
ghost = tx.get(b"D" + (1).to_bytes(8, "big") + b"ghost1000") is not None
tx.abort()
print("opened", seen, ghost, flush=True)
assert sys.stdin.readline().strip() == "go"
store = MetaStore(engine)  # the schema check takes the write lock
with store.write() as tx:
    tx.add_dirent(1, b"survivor", Dirent(7, 0o100000))
with store.read() as tx:
    print("wrote", tx.counter("seq"), [n.decode() for n, _, _ in tx.list_dirents(1)],
          flush=True)
store.close()
"""


def spawn(script: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.endswith("\n"):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"child ended early (rc {proc.returncode}): {err}")
    return line.strip()


def kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL the child; return everything else it wrote to stdout."""
    proc.send_signal(signal.SIGKILL)
    assert proc.stdout is not None and proc.stderr is not None
    # Read through the text wrapper, not communicate(): readline() may already hold more
    # lines in the wrapper's buffer, and communicate() reads the pipe beneath it.
    out = proc.stdout.read()  # to EOF: the child is dead
    proc.stderr.read()
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return out


def assert_consistent(tx: MetaTxn) -> int:
    """The store holds exactly the state after some transaction n of COMMIT_LOOP; return n."""
    n = tx.counter("seq")
    assert n > 0
    inodes = list(tx.iter_inodes())
    assert [i.ino for i in inodes] == [100 + i for i in range(NFILES)]
    for inode in inodes:
        assert (inode.size, inode.version, inode.etag) == (n, n, f"{n:032x}"), (n, inode)
        assert list(tx.list_xattrs(inode.ino)) == [(b"user.n", b"%d" % n)]
    assert tx.counter("inodes") == NFILES
    assert tx.counter("bytes") == NFILES * n
    names = [b"f%08d" % k for k in range(max(1, n - 2), n + 1)]
    assert list(tx.list_dirents(PARENT)) == [
        (name, name, Dirent(int(name[1:]), S_IFREG)) for name in names
    ]
    # nothing else anywhere in the key space
    kinds = {k[:1] for k, _ in tx.kv.scan(b"")}
    assert kinds <= {b"\x00", b"C", b"D", b"I", b"L", b"X"}, kinds
    return n


def run_and_kill(path: Path | str, at_least: int, delay: float, mode: str = "commit",
                 *, script: str = COMMIT_LOOP) -> int:
    """Run ``script`` (COMMIT_LOOP, or a copy over another engine: ``path`` is where its
    store lives) until it has reported ``at_least`` commits, wait ``delay`` seconds,
    SIGKILL it; return the last commit number it reported."""
    proc = spawn(script, str(path), str(NFILES), mode)
    last = 0
    for _ in range(at_least):
        last = int(read_line(proc))
    if delay:
        time.sleep(delay)
    rest = kill(proc)
    for line in rest.splitlines(keepends=True):
        if line.endswith("\n"):  # a print cut off by the kill was not a report
            last = int(line)
    return last


def committed_state(store: MetaStore) -> int:
    """The commit number of the state ``store`` holds, checked to be exactly that
    transaction's (:func:`assert_consistent`) under the current schema; closes ``store``."""
    try:
        assert store.schema_version() == SCHEMA_VERSION
        with store.read() as tx:
            return assert_consistent(tx)
    finally:
        store.close()


def test_killed_writer_leaves_last_committed_state(tmp_path: Path) -> None:
    """Several rounds on one store: each round resumes from the state the last kill left,
    runs ≥ 200 more commits and is killed at a different point."""
    path = tmp_path / "meta"
    done = 0
    for at_least, delay in [(200, 0.0), (211, 0.0005), (233, 0.002), (257, 0.0001), (203, 0.01)]:
        last = run_and_kill(path, at_least, delay)
        assert last >= done + at_least
        n = committed_state(MetaStore.open_lmdb(path))
        # the kill may land after a commit and before its report, never before a report
        assert n in (last, last + 1), (n, last)
        done = n
    assert done >= 1100


def test_group_commit_kill_keeps_every_synced_commit(tmp_path: Path) -> None:
    """Group commit: a kill may lose commits nobody synced, never one a sync covered, and
    always leaves exactly the state after some transaction (never a mix of groups)."""
    path = tmp_path / "meta"
    done = 0
    for at_least, delay in [(30, 0.0), (31, 0.0005), (33, 0.003), (29, 0.0001)]:
        last = run_and_kill(path, at_least, delay, mode="group")
        assert last >= done + 8 * at_least
        n = committed_state(MetaStore.open_lmdb(path))
        assert n >= last, (n, last)
        done = n


def test_killed_open_write_txn_leaves_no_trace(tmp_path: Path) -> None:
    path = tmp_path / "meta"
    holder = spawn(HOLD_OPEN_WRITE, str(path))
    assert read_line(holder) == "holding"
    kill(holder)
    # the dead process held lmdb's writer lock and a reader slot; both must be cleared
    store = MetaStore.open_lmdb(path)
    try:
        with store.read() as tx:
            assert tx.counter("seq") == 1
            assert tx.counter("inodes") == 1
            assert [i.ino for i in tx.iter_inodes()] == [100]
            assert [n for n, _, _ in tx.list_dirents(PARENT)] == [b"base"]
        with store.write() as tx:
            tx.add_counter("seq", 1)
        with store.read() as tx:
            assert tx.counter("seq") == 2
    finally:
        store.close()


def test_survivor_takes_over_the_dead_writers_lock(tmp_path: Path) -> None:
    """Another process that had the store open while the holder died can still write: lmdb's
    robust writer mutex is recovered rather than left locked."""
    path = tmp_path / "meta"
    holder = spawn(HOLD_OPEN_WRITE, str(path))
    assert read_line(holder) == "holding"
    survivor = spawn(SURVIVOR, str(path), stdin=True)
    try:
        # it sees the committed baseline and none of the open transaction
        assert read_line(survivor) == "opened True False"
        kill(holder)
        # (nothing beyond "opened" can sit in the stdout wrapper: it writes only after "go")
        out, err = survivor.communicate("go\n", timeout=30)
    finally:
        for proc in (holder, survivor):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert survivor.returncode == 0, err
    assert out.strip() == "wrote 1 ['base', 'survivor']"
    store = MetaStore.open_lmdb(path)
    try:
        with store.read() as tx:
            assert [n for n, _, _ in tx.list_dirents(PARENT)] == [b"base", b"survivor"]
            assert [i.ino for i in tx.iter_inodes()] == [100]
    finally:
        store.close()


def test_committed_state_survives_kill_without_sync(tmp_path: Path) -> None:
    """sync=False: a commit is in the OS page cache when commit() returns, so a killed process
    loses none of them even without an explicit sync (a machine crash is another matter)."""
    path = tmp_path / "meta"
    script = """
import sys, time
from tierd.meta import Inode, MetaStore
store = MetaStore.open_lmdb(sys.argv[1], sync="durability-points")
for n in range(1, 51):
    with store.write() as tx:
        tx.put_inode(Inode(ino=n, mode=0o100644, uid=0, gid=0, size=n))
print("committed", flush=True)
time.sleep(600)
"""
    proc = spawn(script, str(path))
    assert read_line(proc) == "committed"
    kill(proc)
    store = MetaStore.open_lmdb(path)
    try:
        with store.read() as tx:
            assert [i.size for i in tx.iter_inodes()] == list(range(1, 51))
            assert tx.counter("bytes") == sum(range(1, 51))
    finally:
        store.close()
