"""Namespace inodes as the kernel wants them: ``EntryAttributes`` and ``StatvfsData``.

Timeouts are long because the kernel sees every change made through the mount (it
invalidates what it cached itself) and tierd tells it about every change made through
another door (:mod:`tierd_fuse.invalidate`).  A stat of a cached entry then costs about a
microsecond in the kernel instead of a round trip to this process.
"""

from __future__ import annotations

import pyfuse3

from tierd.namespace.api import Inode, StatFs

#: seconds the kernel may trust a name -> inode mapping without asking again
ENTRY_TIMEOUT = 300.0
#: seconds the kernel may trust an inode's attributes without asking again
ATTR_TIMEOUT = 300.0
#: the I/O size reported in st_blksize: cp, stdio and friends size their buffers from it,
#: and large application writes mean fewer, larger FUSE requests
BLKSIZE = 1 << 20


def entry_attributes(
    inode: Inode, entry_timeout: float = ENTRY_TIMEOUT, attr_timeout: float = ATTR_TIMEOUT
) -> pyfuse3.EntryAttributes:
    """The kernel's view of ``inode`` (tierd inode numbers are used as FUSE node ids)."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = inode.ino
    a.generation = 0  # inode numbers are never reused
    a.entry_timeout = entry_timeout
    a.attr_timeout = attr_timeout
    a.st_mode = inode.mode
    a.st_nlink = inode.nlink
    a.st_uid = inode.uid
    a.st_gid = inode.gid
    a.st_rdev = inode.rdev
    a.st_size = inode.size
    a.st_blksize = BLKSIZE
    # block usage is not tracked per tier yet: report the size rounded up, as a dense file
    a.st_blocks = (inode.size + 511) // 512
    a.st_atime_ns = inode.atime_ns
    a.st_mtime_ns = inode.mtime_ns
    a.st_ctime_ns = inode.ctime_ns
    return a


def negative_entry(timeout: float) -> pyfuse3.EntryAttributes:
    """A reply to a lookup of a missing name that the kernel caches for ``timeout``
    seconds (node id 0), saving the round trip of the next lookup of the same name."""
    a = pyfuse3.EntryAttributes()
    a.st_ino = 0
    a.entry_timeout = timeout
    a.attr_timeout = 0
    return a


def statvfs(st: StatFs) -> pyfuse3.StatvfsData:
    out = pyfuse3.StatvfsData()
    out.f_bsize = st.f_bsize
    out.f_frsize = st.f_frsize
    out.f_blocks = st.f_blocks
    out.f_bfree = st.f_bfree
    out.f_bavail = st.f_bavail
    out.f_files = st.f_files
    out.f_ffree = st.f_ffree
    out.f_favail = st.f_favail
    out.f_namemax = st.f_namemax
    return out
