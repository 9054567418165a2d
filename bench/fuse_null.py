"""The ceiling of the kernel backend's request loop: ``tierd_fuse.kdev`` over operations that
do nothing (no namespace, no disk), measured with the same client work as ``fuse_fio.py``.

Why: the FUSE door's numbers (docs/fuse.md, "Performance") mix three costs -- the kernel's
round trips, the Python request loop (read, parse, task, reply) and the namespace's work per
request.  Serving the very same ``KernelSession`` with empty handlers leaves the first two:
what no change to the namespace can beat on this machine.  Measured here:

* ``create``: open(O_CREAT) + close of new files in one directory (LOOKUP, CREATE, FLUSH,
  RELEASE and the parent's GETATTR, each answered at once), per second;
* ``write``: sequential 1 MiB writes of ``--write-mib`` MiB (WRITE requests whose payload is
  dropped), MB/s; and the same on a tmpfs file as the raw figure of the page-cache copy.

``--c``: the same creates through ``bench/fuse_null_c.c`` too, libfuse's low-level API in C
over handlers that do nothing, built here with gcc (libfuse3-dev): the floor of the round
trips without Python, on the same machine in the same run; ``--c-backing DIR`` adds the
same C daemon making one local file per create under ``DIR`` -- the least a create with
write passthrough needs (its backing file), on the file system that would hold it -- as it
creates (``create_c_backing``) and ahead of the creates in a second thread
(``create_c_ahead``, as tierd's spares are made).
``--poll-us``: the request loop polls the device before it sleeps (``fuse_poll_us``), and so
does the C daemon's (a fixed window).
``--rounds N`` repeats each measurement N times, alternating (the figures of this VM vary
from round to round with where the scheduler puts the client and the daemon).

Usage (root: the mount is made with mount(2)):
``python bench/fuse_null.py [--files 5000] [--write-mib 2048] [--c [--c-backing DIR]]
[--poll-us 100] [--rounds 3]``; prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pyfuse3
from benchlib import idle_state, wait_mounted
from tierd_fuse.kdev import KernelSession
from tierd_fuse.mount import kernel_device, mount_options, unmount

ROOT = pyfuse3.ROOT_INODE

CLIENT = r"""
import json, os, sys, time
what, d, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if what == "create":
    names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
    t = time.perf_counter()
    for p in names:
        os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
    print(json.dumps({"per_s": n / (time.perf_counter() - t)}))
else:
    buf = os.urandom(1 << 20)  # touched: untouched pages split the first write per page
    fd = os.open(os.path.join(d, "w.bin"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    t = time.perf_counter()
    for i in range(n):
        os.write(fd, buf)
    os.close(fd)
    print(json.dumps({"MBps": n * len(buf) / 1e6 / (time.perf_counter() - t)}))
"""


class NullOps:
    """Just enough of :class:`tierd_fuse.ops.TierdOps` for creates and writes: one flat
    directory of files whose bytes go nowhere (sizes are kept, so the kernel's view holds)."""

    readdir_reply: Any = None

    def __init__(self) -> None:
        self.names: dict[bytes, int] = {}
        self.sizes: dict[int, int] = {ROOT: 0}
        self.next_ino = ROOT + 1
        self.writes = 0
        self.write_bytes = 0

    def init(self) -> None:
        pass

    def _attrs(self, ino: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino
        a.entry_timeout = a.attr_timeout = 300
        a.st_mode = (stat.S_IFDIR | 0o777) if ino == ROOT else (stat.S_IFREG | 0o644)
        a.st_nlink = 2 if ino == ROOT else 1
        a.st_size = self.sizes.get(ino, 0)
        a.st_blksize = 1 << 20
        return a

    async def lookup(self, parent: int, name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        ino = self.names.get(name)
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(ino)

    async def getattr(self, ino: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._attrs(ino)

    async def create(self, parent: int, name: bytes, mode: int, flags: int,
                     ctx: Any) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        ino = self.names.get(name)
        if ino is None:
            ino = self.names[name] = self.next_ino
            self.next_ino += 1
        self.sizes[ino] = 0
        return pyfuse3.FileInfo(fh=ino), self._attrs(ino)

    async def open(self, ino: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=ino)

    async def write(self, fh: int, off: int, data: bytes, kill_privs: bool = False) -> int:
        n = len(data)
        self.writes += 1
        self.write_bytes += n
        self.sizes[fh] = max(self.sizes.get(fh, 0), off + n)
        return n

    async def flush(self, fh: int) -> None:
        pass

    async def release(self, fh: int) -> None:
        pass

    async def forget(self, inodes: Sequence[tuple[int, int]]) -> None:
        pass

    async def setattr(self, ino: int, attr: pyfuse3.EntryAttributes, fields: Any,
                      fh: int | None, ctx: Any) -> pyfuse3.EntryAttributes:
        if fields.update_size:
            self.sizes[ino] = attr.st_size
        return self._attrs(ino)

    async def getxattr(self, ino: int, name: bytes, ctx: Any) -> bytes:
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s


async def serve(mnt: Path, work: list[tuple[str, int]], poll_us: int = 0) -> dict[str, Any]:
    ops = NullOps()
    fd = await asyncio.to_thread(kernel_device, mnt, mount_options(True))
    session = KernelSession(cast(Any, ops), fd, poll_us=poll_us)
    served = asyncio.create_task(session.serve())
    out: dict[str, Any] = {}
    try:
        for what, n in work:
            w0, b0 = ops.writes, ops.write_bytes
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CLIENT, what, str(mnt), str(n),
                stdout=subprocess.PIPE)
            stdout, _ = await proc.communicate()
            out[what] = json.loads(stdout)
            if what == "write":
                writes = ops.writes - w0
                out[what]["mean_request_bytes"] = (ops.write_bytes - b0) // max(writes, 1)
    finally:
        await asyncio.to_thread(unmount, mnt, True)
        session.terminate()
        await served
        session.close()
    return out


C_SOURCE = Path(__file__).with_name("fuse_null_c.c")


def build_c(tmp: Path) -> Path:
    """``fuse_null_c.c`` compiled against libfuse3 (gcc and libfuse3-dev are needed)."""
    flags = subprocess.run(["pkg-config", "fuse3", "--cflags", "--libs"], capture_output=True,
                           text=True, check=True).stdout.split()
    exe = tmp / "fuse_null_c"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(exe), str(C_SOURCE), *flags],
                   check=True)
    return exe


def c_creates(exe: Path, tmp: Path, files: int, backing: Path | None = None,
              poll_us: int = 0, ahead: bool = False) -> dict[str, Any]:
    """Creates per second through the C daemon (the client of the Python rounds); with
    ``backing`` each new file also gets a local file made there, as a passthrough create
    needs its backing file -- made by a second thread ahead of the creates with ``ahead``,
    as tierd's spares are."""
    mnt = tmp / "mnt-c"
    mnt.mkdir(exist_ok=True)
    log = tmp / "fuse_null_c.log"
    extra = [] if backing is None else [str(backing)]
    env = dict(os.environ)
    if poll_us > 0:  # the C loop polls the device as the Python one does
        env["FUSE_NULL_POLL_US"] = str(poll_us)
    if ahead:
        env["FUSE_NULL_AHEAD"] = "1"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(exe), str(mnt), *extra], stdout=out, stderr=out, env=env)
    try:
        wait_mounted(cast(Any, proc), mnt, log, "fuse_null_c")
        r = subprocess.run([sys.executable, "-c", CLIENT, "create", str(mnt), str(files)],
                           capture_output=True, text=True, check=True)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        proc.wait(30)
    return cast(dict[str, Any], json.loads(r.stdout))


def python_round(files: int, write_mib: int, poll_us: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tierd-null-") as tmp:
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        cpu0 = time.process_time()
        work = [("create", files)] + ([("write", write_mib)] if write_mib else [])
        res = asyncio.run(serve(mnt, work, poll_us=poll_us))
        res["server_cpu_s"] = round(time.process_time() - cpu0, 2)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--write-mib", type=int, default=2048)
    ap.add_argument("--c", action="store_true",
                    help="also the creates through the C daemon (bench/fuse_null_c.c)")
    ap.add_argument("--c-backing", type=Path, default=None, metavar="DIR",
                    help="with --c: also the C daemon making a local file per create in a "
                    "fresh directory under DIR (the hot tier's file system, say)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--poll-us", type=int, default=0,
                    help="the loop's device polling window (fuse_poll_us; 0: sleep at once)")
    args = ap.parse_args()
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tierd-null-c-") as ctmp:
        exe = build_c(Path(ctmp)) if args.c else None
        for _ in range(args.rounds):
            one = python_round(args.files, args.write_mib, args.poll_us)
            if exe is not None:
                one["create_c"] = c_creates(exe, Path(ctmp), args.files, poll_us=args.poll_us)
            for ahead in (False, True):
                if exe is None or args.c_backing is None:
                    break
                with tempfile.TemporaryDirectory(prefix="tierd-null-c-backing-",
                                                 dir=args.c_backing) as backing:
                    one["create_c_ahead" if ahead else "create_c_backing"] = c_creates(
                        exe, Path(ctmp), args.files, Path(backing), args.poll_us, ahead)
            rounds.append(one)
    res: dict[str, Any] = dict(rounds[0])
    if args.rounds > 1:
        res["rounds"] = rounds
    with tempfile.TemporaryDirectory(prefix="tierd-null-raw-", dir="/dev/shm") as shm:
        r = subprocess.run([sys.executable, "-c", CLIENT, "write", shm, str(args.write_mib)],
                           capture_output=True, text=True, check=True)
        res["write_tmpfs_raw"] = json.loads(r.stdout)
        r = subprocess.run([sys.executable, "-c", CLIENT, "create", shm, str(args.files)],
                           capture_output=True, text=True, check=True)
        res["create_tmpfs_raw"] = json.loads(r.stdout)
    res["poll_us"] = args.poll_us
    res["load_average"] = os.getloadavg()
    res["idle"] = idle_state()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
