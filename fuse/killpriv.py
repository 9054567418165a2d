"""Telling the kernel's killpriv apart from a chmod.

Without ``FUSE_CAP_HANDLE_KILLPRIV`` (pyfuse3 does not ask for it) the kernel drops the
set-user-ID and set-group-ID bits of a file that an unprivileged process writes or truncates
by sending a SETATTR of the mode without those bits, with the *writer's* credentials -- the
same request a chmod(2) by that process would send.  Linux lets the writer do the first and
refuses the second (only the owner may chmod).  The difference the daemon can see is that
a writer holds the file open for writing: :func:`holds_for_writing` looks for such a
descriptor in the calling process's ``/proc/<pid>/fdinfo`` (inode number, access mode, and
a mount of this very file system in that process's own mount table, so a container's view
of the mount counts).  Reading /proc never enters this file system: no request loops back.
Since the mount asks for POSIX ACLs (the kernel then checks permissions itself), a
non-owner's own chmod is refused by the kernel before it is sent; this check keeps the
daemon's own answer the kernel's all the same.
"""

from __future__ import annotations

import os


def holds_for_writing(pid: int, ino: int, dev: str) -> bool:
    """Whether process (or thread) ``pid`` has inode ``ino`` of the file system whose
    device is ``dev`` ("major:minor") open for writing."""
    if pid <= 0 or not dev:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return False
    mounts: dict[str, str] | None = None
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if fields.get("ino", "").strip() != str(ino):
            continue
        try:
            flags = int(fields.get("flags", "0").strip(), 8)
        except ValueError:
            continue
        if not flags & (os.O_WRONLY | os.O_RDWR):
            continue
        if mounts is None:
            mounts = _mount_devices(pid)
        if mounts.get(fields.get("mnt_id", "").strip()) == dev:
            return True
    return False


def _mount_devices(pid: int) -> dict[str, str]:
    """mount id -> "major:minor", from the process's own mount table."""
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            for line in f:
                parts = line.split(None, 3)
                if len(parts) >= 3:
                    out[parts[0]] = parts[2]
    except OSError:
        pass
    return out
