"""Who is calling: a FUSE request's uid/gid plus the caller's supplementary groups.

The kernel passes uid, gid and pid with every request, but not the supplementary groups;
those come from ``/proc/<pid>/status``.  Reading procfs costs ~10-20 us, a large share of a
metadata request, so the groups of a (pid, uid, gid) are remembered for a short time.  A
process that changes its groups (setgroups) is seen with its new groups after at most
:data:`GROUPS_TTL` seconds; a reused pid with another uid/gid gets a new cache key.

Root needs no groups: :mod:`tierd.acl` lets root pass every check that groups could grant,
so requests from uid 0 never touch procfs.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from tierd.acl import Identity
from tierd.acl.identity import read_groups

#: seconds a pid's supplementary groups are trusted before /proc is read again
GROUPS_TTL = 1.0
#: remembered (pid, uid, gid) entries; the oldest is dropped beyond this
CACHE_SIZE = 4096


class Callers:
    """Builds :class:`~tierd.acl.Identity` values for requests, caching procfs reads."""

    def __init__(self, ttl: float = GROUPS_TTL, size: int = CACHE_SIZE) -> None:
        self.ttl = ttl
        self.size = size
        self._cache: OrderedDict[tuple[int, int, int], tuple[float, Identity]] = OrderedDict()

    def identity(self, uid: int, gid: int, pid: int) -> Identity:
        if uid == 0:
            return Identity.ROOT if gid == 0 else Identity(0, gid)
        if pid <= 0:  # kernel-initiated (writeback, release): no process to ask
            return Identity(uid, gid)
        key = (pid, uid, gid)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        ident = Identity(uid, gid, read_groups(pid))
        self._cache[key] = (now, ident)
        self._cache.move_to_end(key)
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return ident
