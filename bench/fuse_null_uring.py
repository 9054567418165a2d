"""``bench/fuse_null_uring.c`` in Python: the same empty handlers over ``/dev/fuse`` or over
FUSE's io_uring queues (:mod:`tierd_fuse.kuring`), one thread per possible CPU, each pinned to
its CPU -- so ``bench/fuse_uring.py`` can tell what the transport is worth to a daemon
written in Python, interpreter lock included, beside the C figures.

    python bench/fuse_null_uring.py MOUNTPOINT dev|uring|uring-one   (root; unmount to stop)

``uring-one`` serves every queue from one unpinned thread through one ring.  At unmount it
prints on stderr how many requests each path answered, as the C daemon does.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading

from tierd_fuse import kproto as K
from tierd_fuse import kuring
from tierd_fuse.mount import MS_NODEV, MS_NOSUID

MAX_WRITE = 128 * 1024
PAYLOAD = 1 << 20  # >= the kernel's max_payload_sz for MAX_WRITE
DEPTH = 2  # ring entries per queue
NO_REPLY = None

_next = [2]
_lock = threading.Lock()


def _attr(ino: int) -> tuple[int, ...]:
    """The fields of a struct fuse_attr (K.ATTR): the root a directory, the rest files."""
    root = ino == K.ROOT_ID
    return (ino, 0, 0, 0, 0, 0, 0, 0, 0, 0o40777 if root else 0o100644, 2 if root else 1,
            0, 0, 0, 4096, 0)


def handle(opcode: int, nodeid: int) -> tuple[int, bytes] | None:
    """(error, reply body) of one request; None: it gets no reply."""
    if opcode == K.LOOKUP:
        return -errno.ENOENT, b""
    if opcode in (K.GETATTR, K.SETATTR):
        return 0, K.ATTR_OUT.pack(1, 0, 0, *_attr(nodeid))
    if opcode == K.CREATE:
        with _lock:
            ino = _next[0]
            _next[0] += 1
        return 0, (K.ENTRY_OUT.pack(ino, 0, 1, 1, 0, 0, *_attr(ino))
                   + K.OPEN_OUT.pack(0, 0, 0))
    if opcode in (K.OPEN, K.OPENDIR):
        return 0, K.OPEN_OUT.pack(0, 0, 0)
    if opcode in (K.FLUSH, K.RELEASE, K.RELEASEDIR, K.FSYNC, K.ACCESS, K.READDIRPLUS,
                  K.READDIR):
        return 0, b""
    if opcode in (K.FORGET, K.BATCH_FORGET, K.INTERRUPT):
        return NO_REPLY
    return -errno.ENOSYS, b""


def serve_queues(dev: int, qids: list[int], cpu: int | None, served: list[int]) -> None:
    """One thread's ring: ``DEPTH`` entries registered for each queue in ``qids``."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    ring = kuring.Ring(dev, 2 * DEPTH * len(qids))
    entries: list[tuple[int, kuring.Entry]] = []
    for qid in qids:
        for _ in range(DEPTH):
            e = kuring.Entry(len(entries), PAYLOAD)
            entries.append((qid, e))
            ring.command(kuring.CMD_REGISTER, e.user_data, qid, entry=e)
    while True:
        ring.enter()
        for user, res in ring.completions():
            if res < 0:
                if res not in (-errno.ENOTCONN, -errno.ECONNABORTED):
                    print(f"queue {qids}: {os.strerror(-res)}", file=sys.stderr)
                return  # unmounted, or refused (/dev/fuse serves on)
            qid, e = entries[user]
            head, _, _, commit_id = e.request()
            _, opcode, unique, nodeid, *_ = K.IN_HEADER.unpack_from(head)
            served[qid] += 1
            got = handle(opcode, nodeid)
            err, body = got if got is not None else (-errno.ENOSYS, b"")
            e.answer(K.OUT_HEADER.pack(K.OUT_HEADER.size + len(body), err, unique), body)
            ring.command(kuring.CMD_COMMIT_AND_FETCH, user, qid, commit_id)


def init_reply(dev: int, buf: bytes, uring: bool) -> None:
    unique = K.IN_HEADER.unpack_from(buf)[2]
    _, minor, readahead, flags, _ = K.INIT_IN.unpack_from(buf, K.IN_HEADER.size)
    flags2 = (kuring.OVER_IO_URING >> 32) if uring else 0
    out = K.INIT_OUT.pack(K.MAJOR, min(minor, K.MINOR), readahead,
                          flags & (K.MAX_PAGES | K.INIT_EXT), 64, 48, MAX_WRITE, 1,
                          MAX_WRITE // 4096, 0, flags2, 0)
    os.write(dev, K.OUT_HEADER.pack(K.OUT_HEADER.size + len(out), 0, unique) + out)


def main() -> None:
    mnt, mode = sys.argv[1], sys.argv[2]
    dev = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    # as the C daemon mounts: default_permissions, so a create costs the same five requests
    opts = f"fd={dev},rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other"
    if libc.mount(b"fuse_null_uring", mnt.encode(), b"fuse.fuse_null_uring",
                  MS_NOSUID | MS_NODEV, opts.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount: {os.strerror(e)}")
    nq = kuring.possible_cpus()
    served = [0] * (nq + 1)  # [nq]: through /dev/fuse
    while True:
        try:
            buf = os.read(dev, MAX_WRITE + 4096)
        except OSError as e:
            if e.errno == errno.ENODEV:  # unmounted
                queues = "".join(f", queue {q} {served[q]}" for q in range(nq))
                print(f"served: /dev/fuse {served[nq]}{queues}", file=sys.stderr)
                os._exit(0)
            if e.errno in (errno.EINTR, errno.ENOENT):
                continue
            raise
        _, opcode, unique, nodeid, *_ = K.IN_HEADER.unpack_from(buf)
        if opcode == K.INIT:
            init_reply(dev, buf, mode != "dev")
            groups = ([(list(range(nq)), None)] if mode == "uring-one"
                      else [([q], q) for q in range(nq)] if mode == "uring" else [])
            for qids, cpu in groups:
                threading.Thread(target=serve_queues, args=(dev, qids, cpu, served),
                                 daemon=True).start()
            continue
        served[nq] += 1
        got = handle(opcode, nodeid)
        if got is None:
            continue
        err, body = got
        try:
            os.writev(dev, [K.OUT_HEADER.pack(K.OUT_HEADER.size + len(body), err, unique),
                            body])
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise


if __name__ == "__main__":
    main()
