"""The kernel's reply structs made from the operations' pyfuse3 values, and the stand-ins
the kernel backend hands the operations in place of pyfuse3's own argument types.

Why a module of its own: :mod:`tierd_fuse.kdev` is the device loop (reading requests,
dispatching them, writing replies); what a reply's bytes hold for a given
``EntryAttributes`` and what the operations get instead of ``RequestContext``,
``SetattrFields`` and ``ReaddirToken`` is a separate concern, used by that loop only.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

import pyfuse3

from . import kproto as K


@dataclass(slots=True)
class KContext:
    """Stands in for ``pyfuse3.RequestContext``: who asks (and the umask of creates)."""

    uid: int
    gid: int
    pid: int
    umask: int = 0


@dataclass(slots=True)
class KSetattrFields:
    """Stands in for ``pyfuse3.SetattrFields``: which attributes a SETATTR changes."""

    update_atime: bool = False
    update_mtime: bool = False
    update_ctime: bool = False
    update_mode: bool = False
    update_uid: bool = False
    update_gid: bool = False
    update_size: bool = False


def _split_time(t: float) -> tuple[int, int]:
    sec = int(t)
    return sec, int((t - sec) * 1e9)


def _attr_fields(a: pyfuse3.EntryAttributes) -> tuple[int, ...]:
    """The values of a ``fuse_attr`` (times split into seconds and nanoseconds)."""
    at, mt, ct = a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns
    return (a.st_ino, a.st_size, a.st_blocks, at // 10**9, mt // 10**9, ct // 10**9,
            at % 10**9, mt % 10**9, ct % 10**9, a.st_mode, a.st_nlink, a.st_uid, a.st_gid,
            a.st_rdev & 0xFFFFFFFF, a.st_blksize, 0)


def entry_out(a: pyfuse3.EntryAttributes) -> bytes:
    """``fuse_entry_out`` of a LOOKUP-like reply (node id 0: a negative entry)."""
    ev, evn = _split_time(a.entry_timeout)
    av, avn = _split_time(a.attr_timeout)
    return K.ENTRY_OUT.pack(a.st_ino, a.generation, ev, av, evn, avn, *_attr_fields(a))


def attr_out(a: pyfuse3.EntryAttributes) -> bytes:
    av, avn = _split_time(a.attr_timeout)
    return K.ATTR_OUT.pack(av, avn, 0, *_attr_fields(a))


class DirToken:
    """Stands in for ``pyfuse3.ReaddirToken``: collects the entries of one READDIR(PLUS)
    reply up to the kernel's buffer size (:meth:`add` is the ops' ``readdir_reply`` on
    this backend)."""

    def __init__(self, size: int, plus: bool) -> None:
        self.size = size
        self.plus = plus
        self.buf = bytearray()
        self.inos: list[int] = []

    def add(self, name: bytes, a: pyfuse3.EntryAttributes, next_id: int) -> bool:
        dirent = K.DIRENT.size + len(name)
        need = K.pad8(dirent) + (K.ENTRY_OUT.size if self.plus else 0)
        if len(self.buf) + need > self.size:
            return False
        if self.plus:
            self.buf += entry_out(a)
        self.buf += K.DIRENT.pack(a.st_ino, next_id, len(name), stat.S_IFMT(a.st_mode) >> 12)
        self.buf += name
        self.buf += bytes(K.pad8(dirent) - dirent)
        if name not in (b".", b".."):
            self.inos.append(a.st_ino)
        return True
