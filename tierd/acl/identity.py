"""Who is asking: the one identity type every door produces.

FUSE builds it from the caller's uid, gid and supplementary groups; S3 from the access key's
user.  The namespace and :mod:`tierd.acl` never know which door a request came through, which
is what makes "one identity, one answer" testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True, slots=True)
class Identity:
    uid: int
    gid: int
    groups: frozenset[int] = field(default_factory=frozenset)

    ROOT: ClassVar[Identity]

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


Identity.ROOT = Identity(0, 0)


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
