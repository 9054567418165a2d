"""FUSE door of tierd: the namespace mounted as a POSIX file system (pyfuse3, asyncio mode).

:class:`FuseDoor` mounts and serves in the daemon's own event loop; :class:`TierdOps` is the
operations table; :mod:`tierd_fuse.mount` checks and clears mount points.
"""

from .mount import FuseDoor, MountError, find_mount, unmount
from .ops import TierdOps

__all__ = ["FuseDoor", "MountError", "TierdOps", "find_mount", "unmount"]
