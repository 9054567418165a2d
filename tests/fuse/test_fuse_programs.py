"""Real programs on the mount: cp, dd, tar, rsync, git, sqlite3, mmap, locks, appends.

Each test checks the bytes that come back (checksums), not just exit codes.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import need, run

pytestmark = pytest.mark.timeout(180)


def make_tree(root: Path, seed: int = 1) -> dict[str, str]:
    """A small tree with nested dirs, empty and odd-sized files, a symlink and a hard link;
    returns relative path -> sha256 of each regular file."""
    rng = random.Random(seed)
    sums: dict[str, str] = {}
    for d in ("a", "a/b", "a/b/c", "empty", "x y"):
        (root / d).mkdir(parents=True, exist_ok=True)
    sizes = [0, 1, 4095, 4096, 4097, 65536, 131073, 1 << 20, (3 << 20) + 7]
    for i, size in enumerate(sizes):
        rel = ["f0", "a/f1", "a/b/f2", "a/b/c/f3", "x y/f 4"][i % 5] + f".{i}"
        data = rng.randbytes(size)
        (root / rel).write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    (root / "a/link").symlink_to("b/f2.2")
    os.link(root / "f0.0", root / "a/hard")
    sums["a/hard"] = sums["f0.0"]
    (root / "a/b/f2.2").chmod(0o640)
    os.utime(root / "a/b/c/f3.3", ns=(1_600_000_000_123_456_789, 1_600_000_000_987_654_321))
    return sums


def tree_sums(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.is_symlink():
                continue
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_cp_a_tree_in_and_out(work: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    sums = make_tree(src)
    run(["cp", "-a", str(src), str(work / "tree")])
    assert tree_sums(work / "tree") == sums
    inside = work / "tree"
    assert os.readlink(inside / "a/link") == "b/f2.2"
    assert (inside / "f0.0").stat().st_ino == (inside / "a/hard").stat().st_ino
    assert oct((inside / "a/b/f2.2").stat().st_mode & 0o777) == "0o640"
    assert (inside / "a/b/c/f3.3").stat().st_mtime_ns == 1_600_000_000_987_654_321
    run(["cp", "-a", str(inside), str(tmp_path / "back")])
    assert tree_sums(tmp_path / "back") == sums
    run(["diff", "-r", "--no-dereference", str(src), str(tmp_path / "back")])


@pytest.mark.parametrize("bs", ["512", "4k", "64k", "1M", "3M"])
def test_dd_block_sizes(work: Path, tmp_path: Path, bs: str) -> None:
    src = tmp_path / "src.bin"
    data = random.Random(bs).randbytes((5 << 20) + 1234)
    src.write_bytes(data)
    dst = work / "dd.bin"
    run(["dd", f"if={src}", f"of={dst}", f"bs={bs}", "conv=fsync", "status=none"])
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    back = tmp_path / "back.bin"
    run(["dd", f"if={dst}", f"of={back}", f"bs={bs}", "status=none"])
    assert back.read_bytes() == data
    # O_DIRECT reads through the mount bypass the kernel cache and still match
    run(["dd", f"if={dst}", f"of={tmp_path / 'direct.bin'}", "bs=1M", "iflag=direct",
         "status=none"])
    assert (tmp_path / "direct.bin").read_bytes() == data


def test_tar_create_and_extract(work: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    sums = make_tree(src, seed=2)
    run(["tar", "-C", str(src), "-cf", str(work / "t.tar"), "."])  # archive written in mount
    (work / "x").mkdir()
    run(["tar", "-C", str(work / "x"), "-xpf", str(work / "t.tar")])  # extracted in mount
    assert tree_sums(work / "x") == sums
    run(["tar", "-C", str(work / "x"), "-cf", str(tmp_path / "u.tar"), "."])  # read from mount
    (tmp_path / "y").mkdir()
    run(["tar", "-C", str(tmp_path / "y"), "-xf", str(tmp_path / "u.tar")])
    assert tree_sums(tmp_path / "y") == sums


def test_rsync_twice_transfers_nothing_the_second_time(work: Path, tmp_path: Path) -> None:
    need("rsync")
    src = tmp_path / "src"
    sums = make_tree(src, seed=3)
    first = run(["rsync", "-aH", "--stats", f"{src}/", f"{work}/r/"])
    assert "Number of regular files transferred: " in first.stdout
    assert tree_sums(work / "r") == sums
    second = run(["rsync", "-aH", "--stats", f"{src}/", f"{work}/r/"])
    assert "Number of regular files transferred: 0" in second.stdout, second.stdout
    assert "Total transferred file size: 0 bytes" in second.stdout, second.stdout
    # and back out, checked by rsync's own checksums
    run(["rsync", "-aH", f"{work}/r/", f"{tmp_path}/back/"])
    check = run(["rsync", "-aHc", "--dry-run", "--itemize-changes", f"{src}/",
                 f"{tmp_path}/back/"])
    assert check.stdout.strip() == "", check.stdout


def test_git_init_commit_log(work: Path) -> None:
    need("git")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com",
               HOME=str(work), GIT_CONFIG_NOSYSTEM="1")
    repo = work / "repo"
    run(["git", "init", "-q", "-b", "main", str(repo)], env=env)
    for i in range(3):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * (i + 1))
        (repo / "sub").mkdir(exist_ok=True)
        (repo / "sub" / "n.txt").write_text(f"rev {i}\n")
        run(["git", "add", "-A"], cwd=repo, env=env)
        run(["git", "commit", "-q", "-m", f"commit {i}"], cwd=repo, env=env)
    log = run(["git", "log", "--format=%s"], cwd=repo, env=env).stdout.split("\n")
    assert log[:3] == ["commit 2", "commit 1", "commit 0"]
    run(["git", "fsck", "--strict"], cwd=repo, env=env)
    run(["git", "gc", "-q"], cwd=repo, env=env)  # packs, renames and deletes objects
    assert run(["git", "show", "HEAD~1:sub/n.txt"], cwd=repo, env=env).stdout == "rev 1\n"
    assert run(["git", "status", "--porcelain"], cwd=repo, env=env).stdout == ""


def test_sqlite_create_write_read(work: Path) -> None:
    need("sqlite3")
    db = work / "t.db"
    script = "PRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT);\n"
    script += "BEGIN;\n" + "".join(
        f"INSERT INTO t(v) VALUES ('{'x' * (i % 97)}-{i}');\n" for i in range(3000)) + "COMMIT;\n"
    script += "UPDATE t SET v = 'updated' WHERE id % 10 = 0;\nDELETE FROM t WHERE id % 7 = 0;\n"
    r = subprocess.run(["sqlite3", str(db)], input=script, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    count = run(["sqlite3", str(db), "SELECT count(*), sum(v = 'updated') FROM t;"]).stdout
    expected_rows = sum(1 for i in range(1, 3001) if i % 7)
    expected_upd = sum(1 for i in range(1, 3001) if i % 7 and i % 10 == 0)
    assert count.strip() == f"{expected_rows}|{expected_upd}"
    assert run(["sqlite3", str(db), "PRAGMA integrity_check;"]).stdout.strip() == "ok"
    # the same database through Python's sqlite3 module, in rollback-journal mode too
    import sqlite3

    con = sqlite3.connect(work / "py.db")
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v BLOB)")
    with con:
        con.executemany("INSERT INTO kv VALUES (?, ?)",
                        [(f"k{i}", os.urandom(100 + i)) for i in range(500)])
    con.close()
    con = sqlite3.connect(work / "py.db")
    assert con.execute("SELECT count(*), sum(length(v)) FROM kv").fetchone() == (
        500, sum(100 + i for i in range(500)))
    con.close()


def test_mmap_shared_write_and_read(work: Path) -> None:
    path = work / "mm.bin"
    size = (2 << 20) + 100
    with open(path, "wb") as f:
        f.truncate(size)
    pattern = bytes(range(256)) * 64
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), size, mmap.MAP_SHARED) as m:
        for off in range(0, size - len(pattern), 300_000):
            m[off:off + len(pattern)] = pattern
        m[size - 5:] = b"tail!"
        m.flush()
    data = path.read_bytes()
    assert len(data) == size and data.endswith(b"tail!")
    for off in range(0, size - len(pattern), 300_000):
        assert data[off:off + len(pattern)] == pattern
    # a second process sees writes made through a shared mapping of the first
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), size, mmap.MAP_SHARED) as m:
        m[:5] = b"HELLO"
        m.flush()
        out = subprocess.run([sys.executable, "-c",
                              f"import mmap;f=open({str(path)!r},'rb');"
                              "m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ);print(m[:5])"],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "b'HELLO'", out.stderr


def test_truncate_extend_and_holes(work: Path) -> None:
    p = work / "sparse"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"start", 0)
        os.pwrite(fd, b"end", 10 << 20)  # a 10 MiB hole in between
        assert os.fstat(fd).st_size == (10 << 20) + 3
        assert os.pread(fd, 16, 5 << 20) == bytes(16)
        os.ftruncate(fd, 3)  # shrink
        assert os.fstat(fd).st_size == 3
        assert os.pread(fd, 100, 0) == b"sta"
        os.ftruncate(fd, 4096 * 3 + 1)  # extend with zeros
        assert os.pread(fd, 20000, 0) == b"sta" + bytes(4096 * 3 + 1 - 3)
    finally:
        os.close(fd)
    os.truncate(p, 0)  # by path
    assert p.stat().st_size == 0 and p.read_bytes() == b""
    run(["truncate", "-s", "5M", str(p)])
    assert p.stat().st_size == 5 << 20
    assert p.read_bytes() == bytes(5 << 20)
    with open(p, "r+b") as f:  # O_TRUNC through open
        pass
    with open(p, "wb") as f:
        f.write(b"x")
    assert p.read_bytes() == b"x"


def test_o_append_from_two_processes(work: Path) -> None:
    p = work / "log"
    p.touch()
    code = ("import os,sys\n"
            "fd=os.open(sys.argv[1], os.O_WRONLY|os.O_APPEND)\n"
            "for i in range(400): os.write(fd, (sys.argv[2]*99+'\\n').encode())\n"
            "os.close(fd)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(p), tag]) for tag in "AB"]
    for proc in procs:
        assert proc.wait(60) == 0
    lines = p.read_text().splitlines()
    assert len(lines) == 800
    assert sorted(set(lines)) == ["A" * 99, "B" * 99]  # no torn or overwritten records
    assert p.stat().st_size == 800 * 100


def test_rename_over_an_open_file(work: Path) -> None:
    old, new = work / "target", work / "incoming"
    old.write_bytes(b"old contents")
    with open(old, "rb") as reader:
        new.write_bytes(b"new contents, longer")
        os.rename(new, old)
        assert reader.read() == b"old contents"  # the open file keeps its bytes
        assert os.fstat(reader.fileno()).st_nlink == 0
    assert old.read_bytes() == b"new contents, longer"
    assert not new.exists()
    # a writer keeps writing to the replaced inode without touching the new name
    with open(old, "r+b") as writer:
        (work / "other").write_bytes(b"third")
        os.rename(work / "other", old)
        writer.write(b"ignored")
        writer.flush()
    assert old.read_bytes() == b"third"


def test_flock_and_fcntl_locks(work: Path) -> None:
    p = work / "lock"
    p.write_bytes(b"x" * 100)
    holder = (
        "import fcntl,os,sys,time\n"
        "f=open(sys.argv[1],'r+b')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(p)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with open(p, "r+b") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(OSError):  # EAGAIN/EACCES: the range is held
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 50)  # another range is free
            fcntl.lockf(f, fcntl.LOCK_UN, 10, 50)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        with open(p, "r+b") as f:
            while True:  # released when the holder exited
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()


def test_large_file_round_trip_and_reopen_cache(work: Path, tmp_path: Path) -> None:
    data = random.Random(9).randbytes(24 << 20)
    p = work / "big"
    p.write_bytes(data)
    for _ in range(2):  # the second read is served from the kernel page cache (keep_cache)
        assert hashlib.md5(p.read_bytes()).digest() == hashlib.md5(data).digest()
    with open(p, "r+b") as f:  # overwrite a middle range; readers see the new bytes
        f.seek(5 << 20)
        f.write(b"Z" * 4096)
    got = p.read_bytes()
    assert got[(5 << 20):(5 << 20) + 4096] == b"Z" * 4096
    assert got[:5 << 20] == data[:5 << 20]
