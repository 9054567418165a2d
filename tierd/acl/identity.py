"""Who is asking: the one identity type every door produces.

FUSE builds it from the caller's uid, gid and supplementary groups; S3 from the access key's
user.  The namespace and :mod:`tierd.acl` never know which door a request came through, which
is what makes "one identity, one answer" testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

#: uid and gid of anonymous S3 requests (the conventional "nobody"): what owns the objects
#: an anonymous request creates where a bucket policy lets ``*`` write
ANONYMOUS_ID = 65534


@dataclass(eq=False, slots=True)
class Grant:
    """What a bucket policy's Allow gives one request: the permission bits in ``mask``
    (R_OK|W_OK|X_OK) pass every check of that request, whatever modes and ACLs say.

    One object per request, never stored.  It ends (``active`` False) as soon as the
    request follows a symbolic link: the policy allowed the key it was asked about, not
    whatever a link inside it points to, which POSIX alone decides."""

    mask: int
    active: bool = True

    def covers(self, mask: int) -> bool:
        return self.active and self.mask & mask == mask


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    groups: frozenset[int] = field(default_factory=frozenset)
    #: a bucket policy's Allow for this one request (see :class:`Grant`); None: POSIX only
    grant: Grant | None = None
    #: an unsigned S3 request: no POSIX identity at all, so no mode bit or ACL entry (not
    #: even "other") applies to it; only a :class:`Grant` lets it in
    anonymous: bool = False

    ROOT: ClassVar[Identity]
    ANONYMOUS: ClassVar[Identity]

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


Identity.ROOT = Identity(0, 0)
Identity.ANONYMOUS = Identity(ANONYMOUS_ID, ANONYMOUS_ID, anonymous=True)


def read_groups(pid: int) -> frozenset[int]:
    """Supplementary groups of ``pid`` from ``/proc/<pid>/status`` (empty when the process
    is gone or unreadable: a request from a vanished process gets only its primary group)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()
