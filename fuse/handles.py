"""Per-mount state the kernel protocol needs and the namespace does not keep.

* :class:`DirHandle` -- a directory listing in progress.  FUSE readdir offsets are integers
  handed back by the kernel; the namespace lists with a name marker (start after this name).
  Each offset given out maps to the name of the entry it follows, so a listing resumes after
  exactly that name: entries added or removed meanwhile are neither repeated nor skipped.
* :class:`KernelCache` -- what the kernel may have cached: lookup counts (so state for an
  inode is dropped when the kernel forgets it) and, per inode, the content version its page
  cache holds, which decides ``keep_cache`` at the next open, and the content version of the
  attributes (above all the size) it was last given, which decides at an open whether its
  cached attributes must be dropped first (close-to-open across nodes, docs/fuse.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierd.acl import Identity

#: offsets of the synthetic entries; real entries get offsets from FIRST_ID on
DOT_ID = 1
DOTDOT_ID = 2
FIRST_ID = 3


@dataclass(slots=True)
class DirHandle:
    ino: int
    ident: Identity  # readdir requests carry no caller: the opener's identity is used
    parent: int
    markers: dict[int, bytes] = field(default_factory=dict)
    next_id: int = FIRST_ID

    def marker(self, offset: int) -> bytes | None:
        """The name after which a listing resumed at ``offset`` continues (b"" from the
        start), or None when the offset was never handed out."""
        if offset <= DOTDOT_ID:
            return b""
        return self.markers.get(offset)

    def offset_after(self, name: bytes) -> int:
        """A new offset meaning "continue after ``name``"."""
        off = self.next_id
        self.next_id += 1
        self.markers[off] = name
        return off


@dataclass(slots=True)
class FileState:
    """What the adapter remembers about an open file handle."""

    ino: int
    writable: bool
    #: opened by root: the namespace then leaves set-id bits to the door at a write by a
    #: process without CAP_FSETID through this handle (the kernel's WRITE_KILL_SUIDGID)
    by_root: bool = False
    wrote: bool = False  # written since the kernel's cached version was last recorded
    passthrough: bool = False  # the kernel writes the hot file itself (kpass.py)
    hot_fd: int = -1  # that hot file (the namespace's descriptor: never closed here)
    advised: int = 0  # end of the range the backing file was asked to read ahead
    last_end: int = -1  # where the previous read ended (sequential detection)


class KernelCache:
    """Lookup counts and page-cache versions of the inodes the kernel knows."""

    def __init__(self) -> None:
        self.lookups: dict[int, int] = {}
        self.versions: dict[int, int] = {}
        #: ino -> content version of the attributes last handed to the kernel
        self.attrs: dict[int, int] = {}

    def looked_up(self, ino: int, n: int = 1) -> None:
        self.lookups[ino] = self.lookups.get(ino, 0) + n

    def forget(self, ino: int, n: int) -> bool:
        """Returns True when the kernel no longer knows ``ino``."""
        left = self.lookups.get(ino, 0) - n
        if left > 0:
            self.lookups[ino] = left
            return False
        self.lookups.pop(ino, None)
        self.versions.pop(ino, None)
        self.attrs.pop(ino, None)
        return True

    def gave_attrs(self, ino: int, version: int) -> None:
        """A reply handed the kernel the attributes of content ``version`` (an entry, a
        getattr or setattr reply, a readdirplus entry), or the kernel computed them itself
        from writes through this mount that committed ``version``."""
        self.attrs[ino] = version

    def attrs_stale(self, ino: int, version: int) -> bool:
        """True when the kernel may hold attributes of another content version than
        ``version`` (the one an open now sees); the version is then recorded as given, since
        the caller makes the kernel fetch it."""
        stale = self.attrs.get(ino) != version
        self.attrs[ino] = version
        return stale

    def keep_cache(self, ino: int, version: int) -> bool:
        """True when the kernel's pages of ``ino`` (if any) hold content ``version``; the
        version is then recorded as what the kernel will cache from this open on."""
        keep = self.versions.get(ino) == version
        self.versions[ino] = version
        return keep

    def cached(self, ino: int, version: int) -> None:
        """The kernel's pages hold ``version`` (after writes made through the mount)."""
        self.versions[ino] = version

    def drop(self, ino: int) -> None:
        """Content changed behind the kernel's back: the next open must not keep pages, nor
        the attributes the kernel holds."""
        self.versions.pop(ino, None)
        self.attrs.pop(ino, None)
