"""FUSE over io_uring (kernel 6.14+): one request queue per CPU, served through io_uring.

Why: on a VM each wake-up of a halted vCPU is an exit to the host, and a request through
``/dev/fuse`` costs two of them whenever the caller and the daemon's reading thread are on
different CPUs (docs/fuse.md, "Wake-ups between CPUs, counted").  Over io_uring the kernel
puts a request on the queue of the CPU its caller runs on and hands it, as task work, to
the thread that registered that queue's entries; a thread pinned to that CPU is woken
beside its caller, without an interrupt, and its answer and the fetch of the next request
are one ``io_uring_enter``.  ``bench/fuse_uring.py`` measures what that is worth.

There is no io_uring binding in the standard library and the packages on PyPI do not speak
FUSE's ring commands, so this is the thin layer over the system calls (``ctypes``): a ring
with 128-byte submission entries (``IORING_SETUP_SQE128``: a FUSE command's
``fuse_uring_cmd_req`` lives in the entry), its three mappings, and the two FUSE commands
(``FUSE_IO_URING_CMD_REGISTER``, ``FUSE_IO_URING_CMD_COMMIT_AND_FETCH``) over entries whose
header and payload buffers the kernel reads and writes in place.  Layouts are those of
``include/uapi/linux/fuse.h`` (7.42) and ``include/uapi/linux/io_uring.h``.

The fuse module takes rings only with its ``enable_uring`` parameter on
(``/sys/module/fuse/parameters/enable_uring``, root); the kernel then offers
:data:`OVER_IO_URING` at INIT, and the ring takes requests once every possible CPU's queue
has an entry.  Forgets, interrupts and notifications stay on ``/dev/fuse``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from pathlib import Path

ENABLE = Path("/sys/module/fuse/parameters/enable_uring")
#: the INIT flag (bit 41: flags2 bit 9) a daemon answers with to take requests over rings
OVER_IO_URING = 1 << 41
CMD_REGISTER, CMD_COMMIT_AND_FETCH = 1, 2
#: struct fuse_uring_req_header: in_out[128] (the in or out header), op_in[128] (the
#: request's own header), then struct fuse_uring_ent_in_out {flags, commit_id, payload_sz}
HEADER_SIZE = 128 + 128 + 32
OP_IN = 128
ENT_IN_OUT = struct.Struct("<QQII8x")
ENT_OFF = 256

_NR_SETUP, _NR_ENTER = 425, 426  # x86-64 (and the same numbers on every architecture since)
_SETUP_SQE128 = 1 << 10
_ENTER_GETEVENTS = 1 << 0
_OP_URING_CMD = 46
_OFF_SQES = 0x10000000
#: struct io_uring_sqe up to its command area: opcode, flags, ioprio, fd, cmd_op, pad,
#: addr, len, rw_flags, user_data (buf_index, personality, file_index: zero)
_SQE = struct.Struct("<BBHiIIQIIQ")
_SQE_SIZE = 128
_CMD_OFF = 48
_CMD_REQ = struct.Struct("<QQH6x")  # struct fuse_uring_cmd_req: flags, commit_id, qid
_CQE = struct.Struct("<QiI")  # user_data, res, flags
_U32 = struct.Struct("<I")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("sq_thread_cpu", ctypes.c_uint32),
                ("sq_thread_idle", ctypes.c_uint32), ("features", ctypes.c_uint32),
                ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                ("sq_off", ctypes.c_uint32 * 10), ("cq_off", ctypes.c_uint32 * 10)]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def possible_cpus(text: str | None = None) -> int:
    """The kernel makes one queue per possible CPU (``num_possible_cpus``): the count of
    ``/sys/devices/system/cpu/possible`` (``text``, as ``0-3,8-11``)."""
    if text is None:
        text = Path("/sys/devices/system/cpu/possible").read_text()
    n = 0
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def _address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Entry:
    """One ring entry: the header buffer and the payload buffer the kernel fills with a
    request and reads the answer from (page-aligned anonymous mappings: the kernel pins
    them)."""

    __slots__ = ("header", "iov", "payload", "user_data")

    def __init__(self, user_data: int, payload_size: int) -> None:
        self.user_data = user_data
        self.header = mmap.mmap(-1, mmap.PAGESIZE)
        self.payload = mmap.mmap(-1, payload_size)
        self.iov = (_Iovec * 2)(_Iovec(_address(self.header), HEADER_SIZE),
                                _Iovec(_address(self.payload), payload_size))

    def request(self) -> tuple[memoryview, memoryview, memoryview, int]:
        """The request in place: its in header, its own header area, its payload, and the
        commit id its answer goes back with."""
        _, commit_id, size, _ = ENT_IN_OUT.unpack_from(self.header, ENT_OFF)
        h = memoryview(self.header)
        return h[:OP_IN], h[OP_IN:ENT_OFF], memoryview(self.payload)[:size], commit_id

    def answer(self, out_header: bytes, body: bytes | bytearray | memoryview) -> None:
        """Write an answer in place: the out header, and the reply's arguments as payload."""
        self.header[:len(out_header)] = out_header
        n = len(body)
        if n:
            self.payload[:n] = body
        struct.pack_into("<I", self.header, ENT_OFF + 16, n)

    def close(self) -> None:
        self.header.close()
        self.payload.close()


class Ring:
    """An io_uring with 128-byte submission entries, for FUSE commands on one device fd.

    Not thread-safe: one thread submits and reaps (its queue's)."""

    def __init__(self, dev_fd: int, entries: int) -> None:
        self.dev_fd = dev_fd
        p = _Params()
        p.flags = _SETUP_SQE128
        fd = int(_libc.syscall(_NR_SETUP, entries, ctypes.byref(p)))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"io_uring_setup: {os.strerror(e)}")
        self.fd = fd
        so, co = list(p.sq_off), list(p.cq_off)
        size = max(so[6] + p.sq_entries * 4, co[5] + p.cq_entries * _CQE.size)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        self._ring = mmap.mmap(fd, size, mmap.MAP_SHARED, prot, offset=0)
        self._sqes = mmap.mmap(fd, p.sq_entries * _SQE_SIZE, mmap.MAP_SHARED, prot,
                               offset=_OFF_SQES)
        self._sq_tail_off, self._sq_array = so[1], so[6]
        self._sq_mask = _U32.unpack_from(self._ring, so[2])[0]
        self._cq_head_off, self._cq_tail_off, self._cqes = co[0], co[1], co[5]
        self._cq_mask = _U32.unpack_from(self._ring, co[2])[0]
        self._tail = _U32.unpack_from(self._ring, self._sq_tail_off)[0]
        self._zero = bytes(_SQE_SIZE)
        self.pending = 0

    def command(self, cmd: int, user_data: int, qid: int, commit_id: int = 0,
                entry: Entry | None = None) -> None:
        """Queue one FUSE ring command (sent at the next :meth:`enter`): a registration
        carries the entry's buffers, a commit the id of the request it answers."""
        idx = self._tail & self._sq_mask
        off = idx * _SQE_SIZE
        self._sqes[off:off + _SQE_SIZE] = self._zero
        addr = ctypes.addressof(entry.iov) if entry is not None else 0
        _SQE.pack_into(self._sqes, off, _OP_URING_CMD, 0, 0, self.dev_fd, cmd, 0, addr,
                       2 if entry is not None else 0, 0, user_data)
        _CMD_REQ.pack_into(self._sqes, off + _CMD_OFF, 0, commit_id, qid)
        _U32.pack_into(self._ring, self._sq_array + 4 * idx, idx)
        self._tail = (self._tail + 1) & 0xFFFFFFFF
        # (the kernel reads the entries only inside io_uring_enter, after its barrier)
        _U32.pack_into(self._ring, self._sq_tail_off, self._tail)
        self.pending += 1

    def enter(self, wait: bool = True) -> None:
        """Send what :meth:`command` queued and, with ``wait``, sleep until a completion
        is there (the interpreter lock is released meanwhile)."""
        while True:
            n = int(_libc.syscall(_NR_ENTER, self.fd, self.pending, 1 if wait else 0,
                                  _ENTER_GETEVENTS if wait else 0, None, 0))
            if n >= 0:
                self.pending -= min(n, self.pending)
                return
            e = ctypes.get_errno()
            if e != errno.EINTR:
                raise OSError(e, f"io_uring_enter: {os.strerror(e)}")

    def completions(self) -> list[tuple[int, int]]:
        """The completions there now, as (user_data, result), taken off the ring."""
        ring = self._ring
        head = _U32.unpack_from(ring, self._cq_head_off)[0]
        tail = _U32.unpack_from(ring, self._cq_tail_off)[0]
        out = []
        while head != tail:
            user, res, _ = _CQE.unpack_from(ring, self._cqes + _CQE.size * (head & self._cq_mask))
            out.append((user, res))
            head = (head + 1) & 0xFFFFFFFF
        _U32.pack_into(ring, self._cq_head_off, head)
        return out

    def close(self) -> None:
        self._sqes.close()
        self._ring.close()
        os.close(self.fd)
