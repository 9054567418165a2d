"""The FUSE kernel protocol: opcodes, flags and struct layouts of ``include/uapi/linux/fuse.h``.

Only what :mod:`tierd_fuse.kdev` speaks is here.  Layouts are those of protocol 7.40+ (the
kernel on the development VM is 6.18, 7.44); the minor version is negotiated in INIT and the
daemon never asks for anything newer than :data:`MINOR`.  All structs are little-endian
native layouts padded to 8 bytes, as the header defines them (``<`` with explicit padding).
"""

from __future__ import annotations

import struct

MAJOR = 7
#: the newest minor this module's layouts cover (fuse_init_out.max_stack_depth: 7.40)
MINOR = 40
#: oldest kernel minor the daemon works with (fuse_init_in flags2 / FUSE_INIT_EXT: 7.36)
MIN_MINOR = 36
ROOT_ID = 1

# -- opcodes (enum fuse_opcode) --------------------------------------------------------------
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR, REMOVEXATTR = 17, 18, 20, 21, 22, 23, 24
FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR = 25, 26, 27, 28, 29, 30
GETLK, SETLK, SETLKW, ACCESS, CREATE, INTERRUPT, BMAP, DESTROY = 31, 32, 33, 34, 35, 36, 37, 38
IOCTL, POLL, NOTIFY_REPLY, BATCH_FORGET, FALLOCATE, READDIRPLUS, RENAME2 = (
    39, 40, 41, 42, 43, 44, 45)
LSEEK, COPY_FILE_RANGE, SYNCFS, TMPFILE, STATX = 46, 47, 50, 51, 52

# -- notify codes (enum fuse_notify_code) -----------------------------------------------------
NOTIFY_INVAL_INODE = 2
NOTIFY_INVAL_ENTRY = 3

# -- INIT flags (bits 32.. go to flags2) ------------------------------------------------------
ASYNC_READ = 1 << 0
ATOMIC_O_TRUNC = 1 << 3
BIG_WRITES = 1 << 5
DONT_MASK = 1 << 6
AUTO_INVAL_DATA = 1 << 12
DO_READDIRPLUS = 1 << 13
READDIRPLUS_AUTO = 1 << 14
ASYNC_DIO = 1 << 15
WRITEBACK_CACHE = 1 << 16
PARALLEL_DIROPS = 1 << 18
HANDLE_KILLPRIV = 1 << 19
POSIX_ACL = 1 << 20
MAX_PAGES = 1 << 22
HANDLE_KILLPRIV_V2 = 1 << 28
INIT_EXT = 1 << 30
PASSTHROUGH = 1 << 37

# -- open reply flags (FOPEN_*) -----------------------------------------------------------------
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_NOFLUSH = 1 << 5
FOPEN_PASSTHROUGH = 1 << 7

# -- setattr valid bits (FATTR_*) -------------------------------------------------------------
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FATTR_ATIME, FATTR_MTIME, FATTR_FH = 1 << 4, 1 << 5, 1 << 6
FATTR_ATIME_NOW, FATTR_MTIME_NOW = 1 << 7, 1 << 8
#: fuse_write_in.write_flags: a write by a caller without CAP_FSETID (HANDLE_KILLPRIV_V2)
WRITE_KILL_SUIDGID = 1 << 2

FSYNC_FDATASYNC = 1 << 0

# -- device ioctls (FUSE_DEV_IOC_*): _IOW(229, nr, size) = 1<<30 | size<<16 | 229<<8 | nr --------
def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (229 << 8) | nr


BACKING_MAP = struct.Struct("<iIQ")  # struct fuse_backing_map {s32 fd; u32 flags; u64 pad}
DEV_IOC_BACKING_OPEN = _iow(1, BACKING_MAP.size)
DEV_IOC_BACKING_CLOSE = _iow(2, 4)
#: FILESYSTEM_MAX_STACK_DEPTH: backing files may live on a stacked file system (overlayfs)
MAX_STACK_DEPTH = 2

# -- headers ----------------------------------------------------------------------------------
#: fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("<IIQQIIIHH")
#: fuse_out_header: len, error (negative errno), unique
OUT_HEADER = struct.Struct("<IiQ")

# -- request bodies -------------------------------------------------------------------------------
INIT_IN = struct.Struct("<IIIII")  # major, minor, max_readahead, flags, flags2 (+ unused[11])
#: fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold,
#: max_write, time_gran, max_pages, map_alignment, flags2, max_stack_depth, unused[6]
INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")
FORGET_IN = struct.Struct("<Q")
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
GETATTR_IN = struct.Struct("<IIQ")
#: fuse_setattr_in: valid, padding, fh, size, lock_owner, atime, mtime, ctime, atimensec,
#: mtimensec, ctimensec, mode, unused4, uid, gid, unused5
SETATTR_IN = struct.Struct("<IIQQQqqqIIIIIIII")
MKNOD_IN = struct.Struct("<IIII")  # mode, rdev, umask, padding
MKDIR_IN = struct.Struct("<II")  # mode, umask
RENAME_IN = struct.Struct("<Q")
RENAME2_IN = struct.Struct("<QII")  # newdir, flags, padding
LINK_IN = struct.Struct("<Q")
OPEN_IN = struct.Struct("<II")  # flags, open_flags
CREATE_IN = struct.Struct("<IIII")  # flags, mode, umask, open_flags
RELEASE_IN = struct.Struct("<QIIQ")  # fh, flags, release_flags, lock_owner
FLUSH_IN = struct.Struct("<QIIQ")  # fh, unused, padding, lock_owner
READ_IN = struct.Struct("<QQIIQII")  # fh, offset, size, read_flags, lock_owner, flags, pad
WRITE_IN = struct.Struct("<QQIIQII")  # fh, offset, size, write_flags, lock_owner, flags, pad
FSYNC_IN = struct.Struct("<QII")  # fh, fsync_flags, padding
SETXATTR_IN = struct.Struct("<II")  # size, flags (FUSE_COMPAT_SETXATTR_IN_SIZE)
GETXATTR_IN = struct.Struct("<II")  # size, padding
ACCESS_IN = struct.Struct("<II")  # mask, padding
INTERRUPT_IN = struct.Struct("<Q")

# -- reply bodies -------------------------------------------------------------------------------
#: fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode,
#: nlink, uid, gid, rdev, blksize, flags
ATTR = struct.Struct("<QQQqqqIIIIIIIIII")
#: fuse_entry_out: nodeid, generation, entry_valid, attr_valid, entry_valid_nsec,
#: attr_valid_nsec, then fuse_attr
ENTRY_OUT = struct.Struct("<QQQQII" + ATTR.format[1:])
#: fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then fuse_attr
ATTR_OUT = struct.Struct("<QII" + ATTR.format[1:])
OPEN_OUT = struct.Struct("<QIi")  # fh, open_flags, backing_id
WRITE_OUT = struct.Struct("<II")  # size, padding
#: fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<QQQQQIIII24x")
GETXATTR_OUT = struct.Struct("<II")  # size, padding
DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type (then the name, padded to 8)
NOTIFY_INVAL_INODE_OUT = struct.Struct("<Qqq")  # ino, off, len
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<QII")  # parent, namelen, flags (then name + NUL)


def pad8(n: int) -> int:
    """FUSE_DIRENT_ALIGN: dirents are padded to 8 bytes."""
    return (n + 7) & ~7


assert IN_HEADER.size == 40 and OUT_HEADER.size == 16
assert INIT_OUT.size == 64 and ATTR.size == 88 and ENTRY_OUT.size == 128
assert ATTR_OUT.size == 104 and SETATTR_IN.size == 88 and STATFS_OUT.size == 80
assert READ_IN.size == WRITE_IN.size == 40 and OPEN_OUT.size == 16 and BACKING_MAP.size == 16
